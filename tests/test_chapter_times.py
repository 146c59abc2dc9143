"""The README's chapter times and each notebook's "**Time:**" line equal what tests/chapter_times.py counts."""
from __future__ import annotations

import json

from chapter_times import ROOT, _apply, minutes, table


def test_readme_and_notebooks_state_the_counted_minutes():
    wrong = _apply(table(), write=False)
    assert not wrong, "run `python -m tests.chapter_times --write`:\n" + "\n".join(wrong)


def test_the_count_grows_with_prose_code_and_exercises(tmp_path):
    nb = json.loads((ROOT / "notebooks" / "00_start_here.ipynb").read_text())
    base = minutes(ROOT / "notebooks" / "00_start_here.ipynb")
    nb["cells"].append({"cell_type": "markdown", "id": "x1", "metadata": {},
                        "source": "word " * 1500})
    path = tmp_path / "00_x.ipynb"
    path.write_text(json.dumps(nb))
    grown = minutes(path)
    assert grown["words"] == base["words"] + 1500 and grown["minutes"] >= base["minutes"] + 10
