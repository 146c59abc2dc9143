"""Which cells a notebook's widget cell needs: the smallest "run these first" list.

The browser smoke test used to run every cell above the widget (minutes in chapters 5 and 6,
mostly measurements the widget never reads). This module reads the cells' Python (``ast``, no
execution) and walks back from the widget cell: a cell is needed when it binds a name that a
needed cell reads (assignment, import, ``def``, ``class``, ``for``/``with`` target). Cells that
only mutate or print are not needed; a cell that reads a name nobody binds (a builtin) needs
nothing for it.
"""
from __future__ import annotations

import ast
import builtins


def _parse(source: str) -> ast.Module | None:
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _names(node: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound and names loaded anywhere inside ``node`` (arguments count as bound)."""
    binds: set[str] = set()
    loads: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (binds if isinstance(sub.ctx, (ast.Store, ast.Del)) else loads).add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(sub.name)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            binds.update(a.asname or a.name.split(".")[0] for a in sub.names if a.name != "*")
        elif isinstance(sub, ast.arg):
            binds.add(sub.arg)
    return binds, loads


def binds_and_reads(source: str) -> tuple[set[str], set[str]]:
    """Names a cell binds, and names it reads before binding them itself (statement order)."""
    tree = _parse(source)
    if tree is None:
        return set(), set()
    binds: set[str] = set()
    reads: set[str] = set()
    for statement in tree.body:
        bound, loads = _names(statement)
        args = {a.arg for a in ast.walk(statement) if isinstance(a, ast.arg)}
        reads |= loads - binds - args
        binds |= bound
    return binds, reads - set(dir(builtins))


def cells_needed(sources: list[str], target: int) -> list[int]:
    """Indices of the cells before ``target`` that it needs, in order (``target`` not included)."""
    _, wanted = binds_and_reads(sources[target])
    needed = []
    for i in range(target - 1, -1, -1):
        binds, reads = binds_and_reads(sources[i])
        if binds & wanted:
            needed.append(i)
            wanted = (wanted - binds) | reads
    return sorted(needed)
