"""Find every exercise in a notebook and build its solution and wrong-answer variants.

An exercise is a code cell that calls a ``check_*`` function, with a learner stub in it
(``answer = ...``, or a ``def`` or ``class`` that raises ``NotImplementedError``), followed by a markdown cell
with ``<details><summary>Solution</summary>``. The solution's code is its fenced ``python`` block,
or else its inline code spans of the form ``answer = ...``.

The variants are the check cell with the stub replaced (solution, a wrong answer) or kept (stub),
and every ``check_*(...)`` call wrapped in ``__record(...)`` so the caller can collect the
Feedback objects. A code exercise also names *plausible* mistakes in the check cell's metadata,
``"exercise_wrong": {"sum instead of mean": "def average_gradients(model): ..."}`` (metadata, so
the learner does not see them): each becomes a variant ``wrong: <label>`` that must fail too. ``tests/nbval_exercises.py`` runs them in the notebook's own kernel, right after
nbval executed the cell, so nothing is computed twice.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_FENCED = re.compile(r"```python\n(.*?)```", re.S)
_INLINE = re.compile(r"`(answer\w*(?:\s*,\s*answer\w*)*\s*=[^`]+)`")
_CHECK = re.compile(r"\bcheck_\w+\(")


@dataclass(frozen=True)
class Exercise:
    cell: int        # index among all cells
    code_cell: int   # index among code cells (nbval's "Cell N")
    source: str
    solution: str
    wrongs: tuple[tuple[str, str], ...] = ()  # (label, code) from the cell's "exercise_wrong"
    title: str = ""  # "Exercise 5", "Capstone": from the markdown above (tests/answers_on_page.py)
    forms: tuple[str, ...] = ()  # the answer's formula as prose could write it ("exercise_answer_forms")


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def solution_code(markdown: str) -> str:
    """The solution's Python: fenced ``python`` blocks, else inline ``answer = ...`` spans."""
    fenced = _FENCED.findall(markdown)
    return "\n".join(block.strip() for block in fenced) if fenced else \
        "\n".join(_INLINE.findall(markdown))


def find_exercises(cells: list[dict]) -> list[Exercise]:
    """Every check cell with the solution block in the markdown cell right after it."""
    found, code_index = [], -1
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        code_index += 1
        source = _source(cell)
        if not _CHECK.search(source):
            continue
        after = _source(cells[i + 1]) if i + 1 < len(cells) else ""
        if cells[i + 1]["cell_type"] != "markdown" or "<summary>Solution" not in after:
            raise ValueError(f"cell {i} calls a check but no Solution block follows it")
        wrongs = tuple(cell.get("metadata", {}).get("exercise_wrong", {}).items())
        forms = tuple(cell.get("metadata", {}).get("exercise_answer_forms", ()))
        found.append(Exercise(i, code_index, source, solution_code(after), wrongs,
                              _title(cells, i), forms))
    return found


_TITLE = re.compile(r"\b(Exercise\s+\d+|Capstone)\b")


def _title(cells: list[dict], index: int) -> str:
    """The exercise's name in the nearest markdown above it ("Exercise 3"), else "cell N"."""
    for cell in reversed(cells[:index]):
        if cell["cell_type"] == "markdown":
            if "<summary>Solution" in _source(cell):
                break  # the exercise before
            found = _TITLE.findall(_source(cell))
            if found:
                return re.sub(r"\s+", " ", found[-1])
    return f"cell {index}"


def _is_stub(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assign):
        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        return all(isinstance(v, ast.Constant) and v.value is Ellipsis for v in values)
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):   # a class: methods left to write
        return any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n)
                   for n in ast.walk(node))
    return False


def _bound(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def stubs(source: str) -> tuple[list[str], list[str]]:
    """Names the learner fills in: (values like ``answer``, functions to write)."""
    values, functions = [], []
    for node in ast.parse(source).body:
        if _is_stub(node):
            (functions if isinstance(node, (ast.FunctionDef, ast.ClassDef))
             else values).extend(sorted(_bound(node)))
    return values, functions


class _Record(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id.startswith("check_"):
            return ast.Call(ast.Name("__record", ast.Load()), [node], [])
        return node


def with_answer(source: str, replacement: str | None) -> str:
    """The check cell with its stub statements replaced by ``replacement`` (None: keep them)."""
    tree = ast.parse(source)
    if replacement is not None:
        wanted = set().union(*(_bound(n) for n in ast.parse(replacement).body))
        body, placed = [], False
        for node in tree.body:
            if _is_stub(node) and _bound(node) & wanted:
                if not placed:
                    body.extend(ast.parse(replacement).body)
                    placed = True
                continue
            body.append(node)
        if not placed:
            raise ValueError("the solution binds none of the stub's names "
                             f"({sorted(set().union(*map(_bound, filter(_is_stub, tree.body))))})")
        tree.body = body
    return ast.unparse(ast.fix_missing_locations(_Record().visit(tree)))


def variants(exercise: Exercise) -> dict[str, str]:
    """Code to run for ``solution`` (must pass), ``stub`` and ``wrong`` (must fail)."""
    values, functions = stubs(exercise.source)
    if not values and not functions:
        raise ValueError(f"cell {exercise.cell}: no learner stub (answer = ... / NotImplementedError)")
    if not exercise.solution.strip():
        raise ValueError(f"cell {exercise.cell}: the Solution block holds no code")
    wrong = exercise.solution + "".join(f"\n{name} = __wrong({name})" for name in values)
    wrong += "".join(f"\ndef {name}(*args, **kwargs):\n    return None" for name in functions)
    built = {"stub": with_answer(exercise.source, None),
             "solution": with_answer(exercise.source, exercise.solution),
             "wrong": with_answer(exercise.source, wrong)}
    for label, code in exercise.wrongs:
        built[f"wrong: {label}"] = with_answer(exercise.source, code)
    return built


def choices(source: str) -> list[str]:
    """String literals inside lists/tuples of the check cell: the options of a multiple choice."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple)):
            found += [e.value for e in node.elts if isinstance(e, ast.Constant)
                      and isinstance(e.value, str)]
    return found
