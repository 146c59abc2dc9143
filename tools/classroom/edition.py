"""The student edition: each chapter without its solutions, exercise stubs intact.

Removed: every ``<details><summary>Solution</summary>`` block, every check cell's
``exercise_wrong`` metadata (the plausible mistakes), and in the library-copy cells each
definition that *is* an exercise's solution (the chapter shows the library's code right after the
exercise), replaced by an import of the same object from ``course_lib``, so later cells run
unchanged. Outputs: figures and tables (image or HTML outputs) of non-exercise cells stay so the
chapter can be read; every other output (text, widgets, exercise verdicts) is cleared, together
with execution counts and timing metadata. A notice at the top says what was removed.
"""
from __future__ import annotations

import ast
import copy
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # exercise_cells
from exercise_cells import _bound as _binds_simple, _is_stub, _source, find_exercises  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
KEPT_MIME = re.compile(r"^(image/|text/html$)")
SOLUTION_BLOCK = re.compile(r"<details>\s*<summary>Solution.*?</details>\s*", re.S)
COMMAND = "python -m tools.classroom student"


def _body(node: ast.AST) -> str:
    """A function's body without its docstring, as an AST dump (formatting and comments ignored)."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def solution_signatures(solution: str) -> tuple[set[str], set[str]]:
    """(names the solution defines at top level, bodies of its functions of >= 2 statements)."""
    tree = ast.parse(solution)
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    bodies = {_body(n) for n in ast.walk(tree)
              if isinstance(n, ast.FunctionDef) and len(n.body) >= 2}
    return names, bodies


def repeats_solution(node: ast.stmt, names: set[str], bodies: set[str]) -> bool:
    """Whether a top-level definition is (or contains) one of the solution's definitions."""
    if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return False
    return node.name in names or any(_body(n) in bodies for n in ast.walk(node)
                                     if isinstance(n, ast.FunctionDef))


def python_only(source: str) -> str:
    """The cell's Python, line for line: a ``%%magic`` line (``%%torchrun 2 ddp.py``: the rest of
    the cell is a script), a ``%line_magic`` or a ``!shell`` line becomes empty, the line numbers
    kept, so that a solution repeated in a script is found too."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.split("\n"))


def hide_solutions(source: str, module: str | None, names: set[str], bodies: set[str],
                   where: str) -> tuple[str, list[str]]:
    """The cell with each definition that repeats a solution replaced by the library's import."""
    tree = ast.parse(python_only(source))
    hidden = [n.name for n in tree.body if repeats_solution(n, names, bodies)]
    if not hidden:
        return source, []
    if module is None:
        raise ValueError(f"{where} repeats an exercise's solution ({hidden}) outside a library-copy "
                         "cell: the student edition cannot replace it by an import")
    lines = source.split("\n")
    for node in sorted((n for n in tree.body if getattr(n, "name", None) in hidden),
                       key=lambda n: -n.lineno):
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        lines[start:node.end_lineno] = [
            f"from {module} import {node.name}  # student edition: the library's {node.name} "
            "is the solution of an exercise above, hidden here"]
    return "\n".join(lines), hidden


def _kept_outputs(cell: dict) -> list[dict]:
    kept = []
    for out in cell.get("outputs", []):
        if out.get("output_type") in ("display_data", "execute_result") and \
                any(KEPT_MIME.match(mime) for mime in out.get("data", {})):
            out = {"output_type": "display_data", "data": out["data"],
                   "metadata": out.get("metadata", {})}
            kept.append(out)
    return kept


def student_notebook(nb: dict, chapter: str) -> tuple[dict, str]:
    """The student edition of one notebook and a one-line account of what was removed."""
    nb = copy.deepcopy(nb)
    cells = nb["cells"]
    exercises = find_exercises(cells)
    solution_cells = {e.cell + 1 for e in exercises}
    check_cells = {e.cell for e in exercises}
    signatures = [solution_signatures(e.solution) for e in exercises]
    names = set().union(*(s[0] for s in signatures))
    bodies = set().union(*(s[1] for s in signatures))
    out, hidden, cleared = [], [], 0
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown" and SOLUTION_BLOCK.search(_source(cell)):
            solution_cells.add(i)  # also a solution to a cell no check_* grades (12's train.py)
        if i in solution_cells:  # the block goes; what follows it in the cell (navigation) stays
            rest = SOLUTION_BLOCK.sub("", _source(cell)).strip()
            if not rest:
                continue
            cell["source"] = rest
        cell.get("metadata", {}).pop("execution", None)
        if cell["cell_type"] == "code":
            cell["execution_count"] = None
            kept = [] if i in check_cells else _kept_outputs(cell)
            cleared += len(cell.get("outputs", [])) - len(kept)
            cell["outputs"] = kept
            cell["metadata"].pop("exercise_wrong", None)
            if i not in check_cells:
                source, gone = hide_solutions(_source(cell), cell["metadata"].get("library_copy"),
                                              names, bodies, f"{chapter} cell {i}")
                if gone:
                    cell["source"] = source
                    hidden += gone
        out.append(cell)
    removed = (f"{len(solution_cells)} solution blocks, the plausible mistakes the tests try, "
               f"{cleared} text or widget outputs (figures and tables kept)")
    if hidden:
        removed += f", the library's {', '.join(hidden)} (imported instead: a solution)"
    notice = {"cell_type": "markdown", "metadata": {"student_edition": True},
              "source": f"> **Student edition** (written by `{COMMAND}`). Removed: {removed}. "
                        "Write each answer in the exercise cell itself (the grader reads that "
                        "cell only, and runs the chapter's other cells as published); run the "
                        "cell to see the check's verdict."}
    if "id" in cells[0]:
        notice["id"] = "student-edition-notice"
    nb["cells"] = [notice] + out
    nb["metadata"]["course"] = {"chapter": chapter, "edition": "student"}
    return nb, removed


def write_edition(notebooks: list[Path], out_dir: Path) -> list[tuple[Path, str]]:
    """Write the student edition of ``notebooks`` into ``out_dir``; return (path, removed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        nb = json.loads(Path(path).read_text())
        student, removed = student_notebook(nb, Path(path).stem)
        target = out_dir / Path(path).name
        target.write_text(json.dumps(student, indent=1, ensure_ascii=False) + "\n")
        written.append((target, removed))
    return written


def answered_notebook(nb: dict, answers: dict[int, str] | None = None) -> dict:
    """``nb`` as a student would submit it: exercise k's stub replaced by ``answers[k]`` (default:
    every exercise's own solution); for tests, benchmarks and a teacher's answer key."""
    nb = copy.deepcopy(nb)
    exercises = find_exercises(nb["cells"])
    answers = {k: e.solution for k, e in enumerate(exercises)} if answers is None else answers
    for k, code in answers.items():
        cell = nb["cells"][exercises[k].cell]
        tree = ast.parse(_source(cell))
        wanted = set().union(*(_binds_simple(n) for n in ast.parse(code).body))
        body, placed = [], False
        for node in tree.body:
            if _is_stub(node) and _binds_simple(node) & wanted:
                body += [] if placed else ast.parse(code).body
                placed = True
            else:
                body.append(node)
        cell["source"] = ast.unparse(ast.Module(body=body, type_ignores=[]))
    return nb
