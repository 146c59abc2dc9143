"""A chapter's algorithm is typed in a notebook cell *and* kept in course_lib: the two must not drift.

A code cell whose metadata says ``"library_copy": "course_lib.<folder>.<module>"`` is the learner's
editable copy of that module's functions and classes (d2l's ``#@save``, kept honest here): every
top-level ``def``/``class`` in the cell must be identical, as an AST (docstrings included,
comments and formatting not), to the definition of the same name in the module. Later chapters,
the checks and the unit tests import the module; the learner edits and reruns the cell.
``python -m tools.sync_cells`` (``tools/sync_cells.py``, which holds the comparison) writes the
module's definitions into the cells. A cell tagged ``"script_copy": "course_lib/scripts/NAME.py"``
is a ``%%torchrun NPROC NAME.py`` line followed by the whole script, byte for byte.
"""
from __future__ import annotations

import pytest

from tools.sync_cells import (COMMAND, KEY, NOTEBOOKS, drift, module_path, script_cells, script_drift,
                        script_path, tagged_cells)


CASES = [(path, index, module, source) for path in NOTEBOOKS
         for index, module, source in tagged_cells(path)]


@pytest.mark.parametrize("path,index,module,source", CASES,
                         ids=[f"{p.stem}-cell{i}" for p, i, _, _ in CASES])
def test_each_tagged_cell_is_identical_to_its_library_copy(path, index, module, source):
    problems = drift(source, module_path(module).read_text(), module)
    assert not problems, (f"{path.name} cell {index}: " + "; ".join(problems) + ". Change both or "
                          f"neither; `{COMMAND}` writes the library's definitions into the cells")


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
        ["f differs from m.f"]
    assert drift("def g():\n    pass\n", library, "m") == ["g is not defined in m"]
    assert drift("x = 1\n", library, "m") == ["the cell defines no function or class"]


SCRIPT_CASES = [(path, index, script, source) for path in NOTEBOOKS
                for index, script, source in script_cells(path)]


@pytest.mark.parametrize("path,index,script,source", SCRIPT_CASES,
                         ids=[f"{p.stem}-cell{i}" for p, i, _, _ in SCRIPT_CASES])
def test_each_script_cell_is_identical_to_its_script(path, index, script, source):
    problems = script_drift(source, script, script_path(script).read_text())
    assert not problems, (f"{path.name} cell {index}: " + "; ".join(problems) + ". Change both or "
                          f"neither; `{COMMAND}` writes the script into the cell")


def test_the_script_checker_finds_a_changed_line_and_a_wrong_magic_line():
    script = "import os\nprint(os.getpid())\n"
    name = "course_lib/scripts/ddp.py"
    assert script_drift("%%torchrun 2 ddp.py\n" + script, name, script) == []
    assert script_drift("%%torchrun 2 ddp.py\n" + script.replace("os.", "os .", 1), name, script)
    assert script_drift("%%torchrun 2 ddp.py\n" + script.rstrip("\n"), name, script)
    assert script_drift("%%torchrun 2 fsdp.py\n" + script, name, script)
    assert script_drift(script, name, script)
