"""A chapter's algorithm is typed in a notebook cell *and* kept in course_lib: the two must not drift.

A code cell whose metadata says ``"library_copy": "course_lib.<folder>.<module>"`` is the learner's
editable copy of that module's functions and classes (d2l's ``#@save``, kept honest here): every
top-level ``def``/``class`` in the cell must be identical, as an AST (docstrings included,
comments and formatting not), to the definition of the same name in the module. Later chapters,
the checks and the unit tests import the module; the learner edits and reruns the cell.
"""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
KEY = "library_copy"


def tagged_cells(path: Path) -> list[tuple[int, str, str]]:
    """(cell index, module name, source) of every cell tagged as a library copy."""
    cells = json.loads(path.read_text())["cells"]
    return [(i, c["metadata"][KEY], "".join(c["source"])) for i, c in enumerate(cells)
            if c["cell_type"] == "code" and KEY in c.get("metadata", {})]


def definitions(source: str) -> dict[str, ast.AST]:
    return {node.name: node for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def drift(cell_source: str, module_source: str, module: str) -> list[str]:
    """What differs between a cell's definitions and the module's (empty: identical)."""
    mine, theirs = definitions(cell_source), definitions(module_source)
    if not mine:
        return ["the cell defines no function or class"]
    problems = []
    for name, node in mine.items():
        if name not in theirs:
            problems.append(f"{name} is not defined in {module}")
        elif ast.dump(node) != ast.dump(theirs[name]):
            problems.append(f"{name} differs from {module}.{name}: change both, or neither")
    return problems


CASES = [(path, index, module, source) for path in NOTEBOOKS
         for index, module, source in tagged_cells(path)]


@pytest.mark.parametrize("path,index,module,source", CASES,
                         ids=[f"{p.stem}-cell{i}" for p, i, _, _ in CASES])
def test_each_tagged_cell_is_identical_to_its_library_copy(path, index, module, source):
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{path.name} cell {index}: no module {module}"
    problems = drift(source, Path(spec.origin).read_text(), module)
    assert not problems, f"{path.name} cell {index}: " + "; ".join(problems)


#: Chapters whose core algorithm must be typed in an editable cell (issue: notebook-first).
CHAPTERS_WITH_CELL_ALGORITHMS = ("01", "02", "03", "04", "05", "06", "07", "08")


@pytest.mark.parametrize("chapter", CHAPTERS_WITH_CELL_ALGORITHMS)
def test_every_chapter_shows_its_algorithm_in_an_editable_cell(chapter):
    found = [module for path in NOTEBOOKS if path.name.startswith(chapter)
             for _, module, _ in tagged_cells(path)]
    assert found, f"chapter {chapter} has no cell tagged {KEY!r}"


def test_the_checker_finds_a_changed_body_a_missing_name_and_an_empty_cell():
    library = "def f(x):\n    '''Twice.'''\n    return 2 * x\n\nclass C:\n    pass\n"
    assert drift("def f(x):\n    '''Twice.'''\n    return 2 * x  # a comment\n", library, "m") == []
    assert drift("def f(x):\n    '''Twice.'''\n    return 3 * x\n", library, "m") == \
        ["f differs from m.f: change both, or neither"]
    assert drift("def g():\n    pass\n", library, "m") == ["g is not defined in m"]
    assert drift("x = 1\n", library, "m") == ["the cell defines no function or class"]
