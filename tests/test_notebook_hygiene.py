"""Every notebook follows the course outline and stores small, clean, reproducible outputs."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MACHINE_PATH = re.compile(r"/(work|tmp|root|home|Users)/")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _text(output: dict) -> str:
    data = output.get("text") or output.get("data", {}).get("text/plain", "")
    return "".join(data) if isinstance(data, list) else data


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_start_here.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_outputs_are_small_and_free_of_machine_paths_and_errors(path):
    assert path.stat().st_size < 600_000, f"{path.name} stores {path.stat().st_size:,} bytes"
    for i, cell in enumerate(c for c in _cells(path) if c["cell_type"] == "code"):
        assert cell.get("outputs") is not None
        for out in cell["outputs"]:
            assert out["output_type"] != "error" or "raises-exception" in cell["metadata"].get("tags", []), \
                f"{path.name}: code cell {i} stores an error"
            assert not MACHINE_PATH.search(_text(out)), f"{path.name}: code cell {i} shows a machine path"
        source = "".join(cell["source"])
        # nbval reads cell tags (nbval-ignore-output, nbval-skip): a comment line would only
        # clutter what the learner reads
        assert "NBVAL_" not in source, f"{path.name}: cell {i} carries an NBVAL comment; use a tag"
    code = [c for c in _cells(path) if c["cell_type"] == "code"]
    assert any(c.get("outputs") for c in code), f"{path.name} stores no outputs: nbval checks nothing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_stored_widget_has_its_state_so_it_shows_before_the_cell_runs(path):
    """A widget output without stored state shows as ``interactive(children=(...`` text."""
    notebook = json.loads(path.read_text())
    state = notebook["metadata"].get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    for i, cell in enumerate(c for c in notebook["cells"] if c["cell_type"] == "code"):
        for out in cell["outputs"]:
            view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if view:
                assert view["model_id"] in state, \
                    f"{path.name}: code cell {i} shows a widget whose state was not stored " \
                    "(execute with --ExecutePreprocessor.store_widget_state=True)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_follow_the_course_outline(path):
    cells = _cells(path)
    first = "".join(cells[0]["source"])
    assert re.search(rf"^# {path.name[:2]} ", first, re.M), f"{path.name}: first cell must hold the title"
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert re.search(r"\]\(\d\d_[a-z_]+\.ipynb\)", first), f"{path.name}: no navigation link on top"
    assert re.search(r"\]\(\d\d_[a-z_]+\.ipynb\)", "".join(cells[-1]["source"])), \
        f"{path.name}: no navigation link at the bottom"
    assert "## Summary" in markdown, f"{path.name}: no summary"
    checks = len(re.findall(r"\bcheck_\w+\(", code))
    solutions = markdown.count("<summary>Solution")
    assert checks >= 2 and solutions >= 2, f"{path.name}: {checks} checks, {solutions} solutions"
    assert "answer = ..." in code or "NotImplementedError" in code, f"{path.name}: no learner stub"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_solution_cell_holds_its_solution_only(path):
    """Each solution sits directly under its exercise, set apart: nothing after its </details>."""
    shared = []
    for cell in json.loads(path.read_text())["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "<summary>Solution" in text:
            if text[text.rfind("</details>") + len("</details>"):].strip():
                shared.append(cell["id"])
    assert shared == [], f"solution cells that run into the next text: {shared}"
