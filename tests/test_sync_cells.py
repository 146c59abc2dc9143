"""``python -m tools.sync_cells``: it writes a drifted definition back from the library, leaves
everything else in the notebook byte for byte, and ``--check`` lists the drift and exits 1."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tools.sync_cells import NOTEBOOKS, ROOT, main, module_path, synced

CHAPTER = ROOT / "notebooks" / "06_fault_tolerance.ipynb"
MODULE = "course_lib.fault_tolerance.commit"
NAME = "save_committed"
WRONG = "    save_sharded(final, model, optimizer)\n"   # a plausible edit: no temporary directory


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _tagged(cells, module, nth=0):
    return [i for i, c in enumerate(cells) if c["metadata"].get("library_copy") == module][nth]


def _write(path, cells):
    nb = json.loads(path.read_text())
    nb["cells"] = cells
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def _library_text(name: str) -> str:
    lines = module_path(MODULE).read_text().splitlines(keepends=True)
    start = next(k for k, line in enumerate(lines) if line.startswith(f"def {name}("))
    end = next(k for k in range(start + 1, len(lines)) if lines[k].strip() and not lines[k][0].isspace())
    return "".join(lines[start:end]).rstrip("\n")


@pytest.fixture
def drifted(tmp_path):
    """A copy of chapter 6 with: the tagged save_committed cell edited (a statement added above
    the definitions, one line of save_committed's body changed), a comment changed in the other
    tagged cell of the same module (same AST), and an untagged cell holding the same wrong code."""
    path = tmp_path / CHAPTER.name
    shutil.copy(CHAPTER, path)
    cells = _cells(path)
    k = _tagged(cells, MODULE, 1)
    source = "".join(cells[k]["source"])
    assert f"def {NAME}(" in source
    body = source.splitlines(keepends=True)
    line = next(j for j, text in enumerate(body) if text.strip().startswith("save_sharded(tmp"))
    wrong = "".join(body[:line] + [WRONG] + body[line + 1:])
    cells[k]["source"] = ("P_DEFAULT = 2\n" + wrong).splitlines(keepends=True)
    other = _tagged(cells, MODULE, 0)
    cells[other]["source"] = ["# my own comment\n"] + cells[other]["source"]
    untagged = next(i for i, c in enumerate(cells) if c["cell_type"] == "code"
                    and "library_copy" not in c["metadata"] and c["outputs"])
    cells[untagged]["source"] = wrong.splitlines(keepends=True)
    _write(path, cells)
    return path, k, untagged


def test_sync_writes_the_drifted_definition_back_and_nothing_else(drifted):
    path, k, _ = drifted
    before = _cells(path)
    assert main([str(path)]) == 0
    after = _cells(path)
    written = "".join(after[k]["source"])
    assert written.startswith("P_DEFAULT = 2\n") and _library_text(NAME) in written and WRONG not in written
    expected = [dict(c) for c in before]
    expected[k] = dict(before[k], source=after[k]["source"])
    assert after == expected      # every other cell (untagged, outputs, the comment) as it was
    _write(path, expected)        # and the file is the same bytes as that, formatting included
    once = path.read_bytes()
    assert main([str(path)]) == 0 and path.read_bytes() == once   # a second run changes nothing


def test_check_lists_the_drift_writes_nothing_and_exits_1(drifted):
    path, k, untagged = drifted
    before = path.read_bytes()
    done = subprocess.run([sys.executable, "-m", "tools.sync_cells", "--check", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout.strip() == f"{path.name} cell {k}: {NAME} differs from {MODULE}.{NAME}"
    assert path.read_bytes() == before


def test_a_name_the_module_lacks_is_reported_not_written(drifted):
    path, k, _ = drifted
    cells = _cells(path)
    cells[k]["source"] = ["def my_schedule(p, m, rank):\n", "    return []\n"]
    _write(path, cells)
    before = path.read_bytes()
    assert main([str(path)]) == 1 and path.read_bytes() == before


def test_sync_is_a_no_op_on_todays_notebooks(tmp_path):
    for notebook in NOTEBOOKS:
        copy = tmp_path / notebook.name
        shutil.copy(notebook, copy)
        assert main([str(copy)]) == 0
        assert copy.read_bytes() == notebook.read_bytes(), notebook.name
    assert main(["--check"]) == 0


def test_synced_replaces_whole_definitions_with_decorators_and_keeps_the_rest():
    library = "import x\n\n@cache\ndef f(a):\n    return a + 1\n\n\nclass C:\n    n = 1\n"
    cell = "y = 2\n@cache\ndef f(a):\n    return a  # edited\nclass C:  # same AST\n    n = 1"
    assert synced(cell, library) == ("y = 2\n@cache\ndef f(a):\n    return a + 1\n"
                                     "class C:  # same AST\n    n = 1")
    assert synced(cell.replace("n = 1", "n = 2"), library).endswith("class C:\n    n = 1")


def test_a_drifted_script_cell_gets_the_script_back_under_its_own_magic_line(tmp_path):
    """A ``script_copy`` cell: the text under its ``%%torchrun`` line is the file's, byte for byte."""
    path = tmp_path / CHAPTER.name
    shutil.copy(CHAPTER, path)
    cells = _cells(path)
    script = ROOT / "course_lib" / "scripts" / "ddp.py"
    edited = script.read_text().replace("opt.zero_grad()", "pass", 1)
    cells.append({"cell_type": "code", "execution_count": None, "id": "scriptcopy1",
                  "metadata": {"script_copy": "course_lib/scripts/ddp.py"}, "outputs": [],
                  "source": ("%%torchrun 4 ddp.py --no-reference\n" + edited).splitlines(True)})
    _write(path, cells)
    assert main(["--check", str(path)]) == 1
    assert main([str(path)]) == 0
    assert "".join(_cells(path)[-1]["source"]) == ("%%torchrun 4 ddp.py --no-reference\n"
                                                   + script.read_text())
    assert main(["--check", str(path)]) == 0


def test_the_old_command_warns_and_forwards(drifted):
    """``python -m tests.sync_cells`` (before the move to tools/) still works one release."""
    path, k, _ = drifted
    done = subprocess.run([sys.executable, "-m", "tests.sync_cells", "--check", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr          # it ran: the drifted cell is listed
    assert f"cell {k}: {NAME} differs" in done.stdout
    assert "DeprecationWarning" in done.stderr and "python -m tools.sync_cells" in done.stderr
