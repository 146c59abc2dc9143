"""The README's chapter times and each notebook's "**Time:**" line equal what tests/chapter_times.py counts,
and that count agrees with a careful newcomer's reading."""
from __future__ import annotations

import json

from chapter_times import ROOT, _apply, code_exercise_minutes, minutes, minutes_of, table

# What tests/chapter_times.py counted in each chapter on 2026-12-07, the day a teacher read every
# chapter as a newcomer would (reading, running, doing the exercises) and estimated 00-04 at about
# 465 minutes and 05-12 at about 535 (issue 61). The old rates (150 words and 20 code lines a
# minute, 20 s a cell, 8 minutes a code exercise, outputs not counted) gave 295 and 345.
TEACHER_READ = {
    "00": (915, 106, 17, 53, 4, 1, [2]), "01": (2366, 178, 21, 109, 5, 3, [6]),
    "02": (2382, 206, 24, 108, 6, 1, [5, 8, 10]), "03": (2418, 403, 21, 113, 5, 3, [3, 8]),
    "04": (2498, 235, 32, 126, 16, 5, [21, 5]), "05": (2422, 167, 27, 102, 6, 3, [10]),
    "06": (2355, 224, 21, 69, 3, 3, [3]), "07": (1893, 142, 17, 45, 2, 3, [1, 3]),
    "08": (2214, 81, 13, 80, 1, 2, [9]), "09": (2368, 115, 25, 86, 11, 1, [5]),
    "10": (1988, 132, 15, 92, 2, 1, [8]), "11": (1562, 101, 13, 35, 1, 1, [8]),
    "12": (881, 80, 12, 113, 1, 2, []),
}
TEACHER_MINUTES = {"00-04": 465, "05-12": 535}


def _read(chapter: str) -> dict:
    words, code, cells, printed, figures, questions, written = TEACHER_READ[chapter]
    return {"words": words, "code_lines": code, "cells_run": cells, "output_lines": printed,
            "figures": figures, "questions": questions, "written": written, "check_yourself": 3}


def test_readme_and_notebooks_state_the_counted_minutes():
    wrong = _apply(table(), write=False)
    assert not wrong, "run `python -m tests.chapter_times --write`:\n" + "\n".join(wrong)


def test_the_count_agrees_with_a_newcomers_reading():
    """Within 10 % of the teacher's estimate for each half of the course (the old rates: -37 %)."""
    for part, want in TEACHER_MINUTES.items():
        first, last = part.split("-")
        got = sum(minutes_of(_read(ch)) for ch in TEACHER_READ if first <= ch <= last)
        assert abs(got - want) <= 0.1 * want, f"chapters {part}: counted {got} min, a newcomer {want}"


def test_a_code_exercise_takes_10_to_30_minutes_by_what_the_learner_writes():
    assert code_exercise_minutes(0) == 10 and code_exercise_minutes(200) == 30
    # MyDDP's hooks (chapter 02): 8 lines to write into a 20-line stub, the longest of a newcomer's hour
    assert 15 <= code_exercise_minutes(8) < 30


def test_the_count_grows_with_prose_code_and_exercises(tmp_path):
    nb = json.loads((ROOT / "notebooks" / "00_start_here.ipynb").read_text())
    base = minutes(ROOT / "notebooks" / "00_start_here.ipynb")
    nb["cells"].append({"cell_type": "markdown", "id": "x1", "metadata": {},
                        "source": "word " * 1500})
    nb["cells"].append({"cell_type": "code", "id": "x2", "metadata": {}, "execution_count": None,
                        "source": "\n".join(f"x{i} = {i}" for i in range(100)),
                        "outputs": [{"output_type": "stream", "name": "stdout",
                                     "text": "line\n" * 120}]})
    path = tmp_path / "00_x.ipynb"
    path.write_text(json.dumps(nb))
    grown = minutes(path)
    assert grown["words"] == base["words"] + 1500 and grown["code_lines"] == base["code_lines"] + 100
    assert grown["output_lines"] == base["output_lines"] + 120
    # 1500 words at 110 a minute, 100 lines at 10 a minute, 120 printed lines at 60, one cell run
    assert grown["minutes"] >= base["minutes"] + 25
