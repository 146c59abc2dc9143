"""The student edition: no solution code or text of any exercise, stubs intact, a notice on top."""
import ast
import json
import re
from pathlib import Path

import pytest

from tools.classroom.edition import (CHAPTERS, SOLUTION_BLOCK, _body, python_only, student_notebook,
                                    write_edition)
from tools.classroom.grade import identify

from exercise_cells import _source, find_exercises
from tools.sync_cells import module_path

FENCE = re.compile(r"```python\n.*?```", re.S)


def solution_pieces(solution: str) -> set[str]:
    """Its top-level statements and the bodies of its functions of >= 2 statements (as ASTs)."""
    tree = ast.parse(solution)
    return {ast.dump(n) for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))} | \
        {_body(n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and len(n.body) >= 2}


def notebook_pieces(nb: dict) -> set[str]:
    """Every statement and function body of every code cell."""
    found = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            tree = ast.parse(python_only(_source(cell)))  # a magic's line is not Python
            found |= {ast.dump(n) for n in ast.walk(tree) if isinstance(n, ast.stmt)}
            found |= {_body(n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    return found


def leaks(published: dict, edition: dict) -> list[str]:
    """Solution code or prose of ``published``'s exercises that ``edition`` still holds."""
    text = json.dumps(edition)
    pieces = notebook_pieces(edition)
    found = []
    for e in find_exercises(published["cells"]):
        stub = notebook_pieces({"cells": [published["cells"][e.cell]]})
        found += [f"cell {e.cell}: {p[:80]}" for p in solution_pieces(e.solution) - stub
                  if p in pieces]
        block = SOLUTION_BLOCK.search(_source(published["cells"][e.cell + 1])).group(0)
        prose = FENCE.sub("", block)
        found += [f"cell {e.cell + 1}: {line[:80]}" for line in prose.splitlines()
                  if len(line.strip()) > 40 and json.dumps(line.strip())[1:-1] in text]
    if "<summary>Solution" in text or "exercise_wrong" in text:
        found.append("a Solution block or the listed mistakes")
    return found


@pytest.fixture(scope="module")
def editions(tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    written = write_edition(CHAPTERS, out)
    return {path.stem: (json.loads(src.read_text()), json.loads(path.read_text()))
            for src, (path, _) in zip(CHAPTERS, written)}


@pytest.mark.parametrize("chapter", [p.stem for p in CHAPTERS])
def test_the_student_edition_holds_no_solution_and_the_published_one_does(editions, chapter):
    published, edition = editions[chapter]
    assert leaks(published, edition) == []
    assert leaks(published, published)  # the check finds what the published notebook shows


@pytest.mark.parametrize("chapter", [p.stem for p in CHAPTERS])
def test_stubs_stay_outputs_are_only_figures_and_tables_and_a_notice_says_so(editions, chapter):
    published, edition = editions[chapter]
    notice = _source(edition["cells"][0])
    assert "Student edition" in notice and "solution blocks" in notice
    stubs = [e.source for e in find_exercises(published["cells"])]
    assert [c for c in map(_source, edition["cells"]) if c in stubs] == stubs
    for cell in edition["cells"]:
        if cell["cell_type"] == "code":
            assert cell["execution_count"] is None
            for out in cell["outputs"]:
                assert any(m.startswith("image/") or m == "text/html" for m in out["data"])
                assert "check_" not in _source(cell)
    assert identify(edition).stem == chapter


def test_a_leaking_library_copy_outside_a_tagged_cell_is_refused():
    nb = json.loads(CHAPTERS[3].read_text())   # 03: exercise 1's answer typed again, untagged
    cell = next(c for c in nb["cells"] if c["metadata"].get("library_copy") and
                "class ShardedOptimizer" in _source(c))
    cell["source"] = ("def my_shard_bounds(numel, rank, world):\n    size = -(-numel // world)\n"
                      "    start = min(rank * size, numel)\n    return start, min(start + size, numel)\n\n"
                      + _source(cell))
    del cell["metadata"]["library_copy"]
    with pytest.raises(ValueError, match="repeats an exercise's solution"):
        student_notebook(nb, "03")


def test_each_hidden_definition_is_imported_from_the_library_instead(editions):
    imported = set()
    for published, edition in editions.values():
        for cell in edition["cells"]:
            for line in _source(cell).splitlines():
                if "# student edition:" in line:
                    node = ast.parse(line).body[0]
                    tree = ast.parse(module_path(node.module).read_text())  # no torch import
                    defined = {n.name for n in tree.body if hasattr(n, "name")}
                    assert {a.name for a in node.names} <= defined, line
                    imported |= {a.name for a in node.names}
    assert imported >= {"DDPByHand"}  # 02 (03 and 04 no longer type an answer)


def test_the_old_command_warns_and_forwards(tmp_path):
    """``python -m tests.classroom`` (before the move to tools/) still works one release."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.classroom", "student", str(tmp_path),
                           str(root / "notebooks" / "00_start_here.ipynb")], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "00_start_here.ipynb").is_file()
    assert "DeprecationWarning" in done.stderr and "python -m tools.classroom" in done.stderr
