"""No exercise is answered on the page above it (issue 60, item 1), over every chapter.

What gives an answer away, and how it is found, is in ``tests/answers_on_page.py``. This test
checks everything that needs no kernel (numbers a solution computes without the notebook, formulas
in a hint or in the check call, functions defined in a published cell, a later section above);
during nbval each exercise's item (``tests/nbval_exercises.py``) also checks the numbers its
solution computes from the notebook's state against the stored page.

``OPEN``: the exercises still answered on their page, per chapter, each with its finding. The
chapter's owner empties it: fix the page, then delete the line (an entry that no longer finds
anything fails here, so the set only shrinks). An exercise not in it that reveals its answer fails.
Run: ``python -m pytest tests/test_no_answer_on_page.py -q -p no:cacheprovider`` (seconds).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from answers_on_page import reveals, shows_number, static_numbers
from exercise_cells import find_exercises

OPEN: dict[str, dict[str, str]] = {
    # chapter -> {exercise title: the finding}. Entries marked "(nbval)" are found only in the
    # kernel (the number comes from the notebook's state); this test cannot see them go.
}

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def findings(cells: list[dict]) -> dict[str, list[str]]:
    """exercise title -> what gives its answer away (only the exercises that reveal something)."""
    found = {}
    for exercise in find_exercises(cells):
        got = reveals(cells, exercise)
        if got:
            found[exercise.title] = got
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_exercise_is_answered_above_itself(path):
    chapter = path.name[:2]
    found = findings(json.loads(path.read_text())["cells"])
    still_open = OPEN.get(chapter, {})
    new = {title: got for title, got in found.items() if title not in still_open}
    assert not new, f"{path.name}: exercises answered on the page: {new}"
    gone = [title for title, note in still_open.items() if title not in found and "(nbval)" not in note]
    assert not gone, f"{path.name}: {gone} no longer give their answer away: delete them from OPEN"


def _cells(chapter: str) -> list[dict]:
    path = next(p for p in NOTEBOOKS if p.name.startswith(chapter))
    return json.loads(path.read_text())["cells"]


def _clean_exercise(cells: list[dict]):
    """An exercise of the chapter that gives nothing away (the broken variants start from it)."""
    for exercise in find_exercises(cells):
        if not reveals(cells, exercise):
            return exercise
    raise AssertionError("no clean exercise")


def test_an_answer_pasted_into_a_stored_output_above_is_found():
    cells = _cells("06")
    exercise = next(e for e in find_exercises(cells) if static_numbers(e))
    value = static_numbers(exercise)[0]   # Young/Daly: 30.98... minutes
    above = max(j for j in range(exercise.cell) if cells[j]["cell_type"] == "code")
    broken = copy.deepcopy(cells)
    broken[above]["outputs"] = [{"output_type": "stream", "name": "stdout",
                                 "text": [f"checkpoint every {value:.2f} min\n"]}]
    assert any(f.startswith("number:") for f in reveals(broken, exercise))
    assert not any(f.startswith("number:") for f in reveals(cells, exercise))


def test_a_number_is_found_as_written_rounded_or_scaled_but_not_a_small_one():
    assert shows_number("33,554,432 B", 33554432) == "33,554,432"
    assert shows_number("about 33.6 MB", 33554432) and shows_number("32.0 MiB", 33554432)
    assert shows_number("bubble 27.3 %", 3 / 11) and shows_number("bubble 0.273", 3 / 11)
    assert not shows_number("bubble 0.3", 3 / 11)          # too few digits to say
    assert not shows_number("4 ranks, 1 stage", 4)          # small integers are everywhere
    assert not shows_number("1024 elements", 33554432)


def test_a_published_function_a_formula_hint_and_a_computed_check_are_found():
    cells = _cells("07")
    exercise = next(e for e in find_exercises(cells) if e.title == "Exercise 1")   # merge_lora
    assert not reveals(cells, exercise)
    solution = exercise.solution
    published = copy.deepcopy(cells)
    published.insert(exercise.cell - 1, {"cell_type": "code", "metadata": {}, "outputs": [],
                                         "source": solution.replace("merge_lora", "merged_weight")})
    moved = find_exercises(published)[0]
    assert any("solution's body" in f for f in reveals(published, moved))
    named = copy.deepcopy(cells)
    named.insert(exercise.cell + 2, {"cell_type": "code", "metadata": {}, "outputs": [],
                                     "source": "from course_lib.finetuning import merge_lora\n"
                                               "def merge_lora(layer):\n    return layer\n"})
    assert any("defines merge_lora" in f for f in reveals(named, find_exercises(named)[0]))
    hinted = copy.deepcopy(cells)
    cell = hinted[exercise.cell]
    cell["source"] = "".join(cell["source"]).replace(
        'name="merge LoRA")', 'name="merge LoRA", hint="W + scale * B @ A")')
    assert any(f.startswith("formula: the hint") for f in reveals(hinted, find_exercises(hinted)[0]))
    computed = {"cell_type": "code", "metadata": {}, "outputs": [],
                "source": "answer = ...\ncheck_number(answer, 2 * 4 * 1024, name='bytes')\n"}
    solution_md = {"cell_type": "markdown", "metadata": {},
                   "source": "<details><summary>Solution</summary>\n\n`answer = 8192`\n</details>"}
    alone = [computed, solution_md]
    assert any("in sight" in f for f in reveals(alone, find_exercises(alone)[0]))


def test_a_formula_the_metadata_names_is_found_in_the_prose_above():
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "The bubble is (p − 1)/(m + p − 1)."},
             {"cell_type": "code", "metadata": {"exercise_answer_forms": ["(p-1)/(m+p-1)"]},
              "outputs": [], "source": "answer = ...\ncheck_number(answer, bubble, name='b')\n"},
             {"cell_type": "markdown", "metadata": {},
              "source": "<details><summary>Solution</summary>\n\n`answer = 3 / 11`\n</details>"}]
    exercise, = find_exercises(cells)
    assert any("writes '(p-1)/(m+p-1)'" in f for f in reveals(cells, exercise))
    cells[0]["source"] = "The bubble is the idle share of a rank's time."
    assert not reveals(cells, exercise)


def test_an_exercise_below_a_later_sections_output_is_found():
    md = lambda s: {"cell_type": "markdown", "metadata": {}, "source": s}  # noqa: E731
    code = lambda s: {"cell_type": "code", "metadata": {}, "outputs": [], "source": s}  # noqa: E731
    cells = [md("## 3. Layouts"), code("x = 1"), md("## 2. Meshes"),
             code("answer = ...\ncheck_number(answer, dp, name='dp')\n"),
             md("<details><summary>Solution</summary>\n\n`answer = dp`\n</details>")]
    assert any(f.startswith("order:") for f in reveals(cells, find_exercises(cells)[0]))


def test_open_entries_name_exercises_that_exist():
    for chapter, entries in OPEN.items():
        titles = {e.title for e in find_exercises(_cells(chapter))}
        assert set(entries) <= titles, f"{chapter}: OPEN names {set(entries) - titles}"
