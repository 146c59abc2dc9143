"""The autograder on chapter 00 (one batch, graded once): the solutions score every exercise, the
student edition none, a mistake fails its exercise only, with the check's feedback. The mistake is
graded on chapter 00's exercise section alone (its own exercise cells and checks after the imports
they need, ``SECTION``): it needs the checks, not the chapter's training run, which the two other
submissions already put through the grader twice each. Containment (a crash, a deleted folder, a
deadlock on the ranks) on a chapter of two quick exercises, ``TINY``; a hang and a flood in the
kernel itself: ``test_session.py``."""
import csv
import json
import os

import pytest

from tools.classroom.edition import CHAPTERS, answered_notebook, find_exercises, student_notebook
from tools.classroom.grade import extract_answer, grade_folder
from tools.classroom.gradebook import write_gradebook
from tools.classroom.sandbox import why_not

from processes import rank_processes

# Without sandboxes (not root: a learner's test run) the grading is still tested, as a teacher
# grades work they trust (``--trusted``: no sandbox); CI, as root, requires the sandboxes.
NO_SANDBOX = why_not()
if NO_SANDBOX is not None and os.environ.get("COURSE_REQUIRE_SANDBOX") == "1":
    raise RuntimeError(f"COURSE_REQUIRE_SANDBOX=1 but no sandbox can be made: {NO_SANDBOX}")
TRUSTED = NO_SANDBOX is not None

CHAPTER = CHAPTERS[0]          # 00: two exercises, a value and a function run on 4 ranks
RIGHT = "answer = 50"
SUM_NOT_MEAN = ("def mean_of_ranks():\n    x = torch.tensor([float(dist.get_rank())])\n"
                "    dist.all_reduce(x)\n    return x.item()")
TIME_LIMIT = 20.0
SECTION_STEM = "00_start_here_exercises"


def exercise_section(nb: dict) -> dict:
    """Chapter 00's exercise section as a chapter: a title, the imports its cells use, then every
    cell from the markdown that opens the first exercise to the last Solution block."""
    first = find_exercises(nb["cells"])[0].cell - 1
    last = find_exercises(nb["cells"])[-1].cell + 1
    return {**nb, "cells": [
        _md("# Chapter 00's exercises alone"),
        _code("import torch\nimport torch.distributed as dist\nfrom course_lib import run"),
        *nb["cells"][first:last + 1]]}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    nb = json.loads(CHAPTER.read_text())
    section = tmp_path_factory.mktemp("section") / f"{SECTION_STEM}.ipynb"
    section.write_text(json.dumps(exercise_section(nb)))
    submissions = {   # file names say nothing: the grader finds the chapter in the content
        "s1.ipynb": answered_notebook(nb),
        "s2.ipynb": student_notebook(nb, CHAPTER.stem)[0],
        "s3.ipynb": answered_notebook(exercise_section(nb), {0: RIGHT, 1: SUM_NOT_MEAN}),
    }
    for name, content in submissions.items():
        (folder / name).write_text(json.dumps(content))
    (folder / "notes.ipynb").write_text("{not json")
    results = {r.file.rsplit("/", 1)[1]: r for r in grade_folder(
        folder, time_limit=TIME_LIMIT, chapters=[CHAPTER, section], trusted=TRUSTED)}
    assert rank_processes() == []
    return results, write_gradebook(list(results.values()), tmp_path_factory.mktemp("book"))


def verdicts(result):
    return [e.passed for e in result.exercises]


def test_the_solutions_score_every_exercise_and_the_student_edition_none(graded):
    results, _ = graded
    assert results["s1.ipynb"].chapter == CHAPTER.stem and verdicts(results["s1.ipynb"]) == [True, True]
    assert verdicts(results["s2.ipynb"]) == [False, False]
    assert all("] TO DO: " in " ".join(e.feedback) for e in results["s2.ipynb"].exercises), \
        [e.feedback for e in results["s2.ipynb"].exercises]


def test_a_mistake_fails_exactly_its_exercise_with_the_checks_feedback(graded):
    result = graded[0]["s3.ipynb"]
    assert result.chapter == SECTION_STEM and verdicts(result) == [True, False]
    assert "returned something else than the mean" in " ".join(result.exercises[1].feedback)
    assert graded[0]["notes.ipynb"].error.startswith("not a readable notebook")


def test_the_gradebook_has_a_row_per_notebook_and_the_feedback_no_solution(graded):
    results, (csv_path, html_path) = graded
    rows = {r["file"].rsplit("/", 1)[1]: r for r in csv.DictReader(csv_path.open())}
    assert rows["s1.ipynb"]["total"] == "2" and rows["s1.ipynb"]["percent_correct"] == "100.0"
    assert rows["s3.ipynb"][f"{SECTION_STEM}: mean of ranks"] == "0"
    assert rows["notes.ipynb"]["error"]
    page = html_path.read_text()
    assert "returned something else than the mean" in page
    assert "dist.all_reduce" not in page and "answer = 50" not in page


def test_an_answer_may_not_redefine_the_check():
    published = next("".join(c["source"]) for c in json.loads(CHAPTER.read_text())["cells"]
                     if c["cell_type"] == "code" and "answer = ..." in "".join(c["source"])
                     and "check_number(" in "".join(c["source"]))
    with pytest.raises(ValueError, match="redefines check_number"):
        extract_answer(published, published.replace(
            "answer = ...", "check_number = lambda *a, **k: True\nanswer = 1"))
    with pytest.raises(ValueError, match="syntax error"):
        extract_answer(published, published.replace("answer = ...", "answer = = 1"))


def test_a_batch_is_graded_jobs_at_a_time_and_reported_in_file_order(tmp_path, monkeypatch):
    import threading
    import tools.classroom.grade as grade
    monkeypatch.setattr(grade, "why_not", lambda: "simulated: not root")
    for name in ("b", "c", "a"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    together = threading.Barrier(2, timeout=60)   # a and b end only once both run at once

    def fake(path, **kwargs):
        if path.stem == "c":
            raise RuntimeError("its grading broke")
        together.wait()
        return grade.Result(str(path), "x")
    monkeypatch.setattr(grade, "grade_notebook", fake)
    lines = []
    results = grade_folder(tmp_path, trusted=True, jobs=2, progress=lines.append)
    assert [r.file.rsplit("/", 1)[1] for r in results] == ["a.ipynb", "b.ipynb", "c.ipynb"]
    assert [r.error for r in results] == [None, None, "RuntimeError: its grading broke"]
    assert [line.split(":")[0].rsplit("/", 1)[1] for line in lines] == \
        ["a.ipynb", "b.ipynb", "c.ipynb"]
    from tools.classroom.__main__ import main
    with pytest.raises(SystemExit):   # the command line refuses a batch of no submissions at once
        main(["grade", str(tmp_path), str(tmp_path / "book"), "--trusted", "--jobs", "0"])


def _md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text):
    return {"cell_type": "code", "metadata": {}, "source": text, "outputs": [],
            "execution_count": None}


TINY = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
    _md("# A tiny chapter\n\nTwo exercises, the second one on 2 ranks."),
    _code("from course_lib import check_number, check_true, run\nbase = 41\n"
          "run(lambda: None, 2)  # the helper that forks ranks is up before the first check"),
    _md("What is `base + 1`?"),
    _code("answer = ...\ncheck_number(answer, base + 1, name='plus one')"),
    _md("<details><summary>Solution</summary>\n\n`answer = 42`\n</details>"),
    _code("def double(x):\n    raise NotImplementedError\n\n"
          "check_true(lambda: (run(lambda: double(base), 2) == [2 * base] * 2, 'doubled on 2 ranks'),"
          " name='double')"),
    _md("<details><summary>Solution</summary>\n\n```python\ndef double(x):\n"
        "    return 2 * x\n```\n</details>"),
]}
DOUBLE = "def double(x):\n    return 2 * x"
DEADLOCK = ("def double(x):\n    import torch, torch.distributed as dist\n"
            "    if dist.get_rank() == 0:\n        dist.all_reduce(torch.zeros(1))  # rank 1 never comes\n"
            "    return 2 * x")
EOF_ON_RANK_1 = ("def double(x):\n    import torch.distributed as dist\n"
                 "    if dist.get_rank() == 1:\n        raise EOFError()  # no message at all\n"
                 "    return 2 * x")


def test_a_crash_a_deleted_folder_a_deadlock_and_a_failing_rank_fail_only_their_exercise(
        tmp_path):
    chapter = tmp_path / "99_tiny.ipynb"
    chapter.write_text(json.dumps(TINY))
    folder = tmp_path / "in"
    folder.mkdir()
    cases = {"crash": {0: "import os\nos._exit(3)\nanswer = 42", 1: DOUBLE},
             "delete": {0: "import os, shutil\nshutil.rmtree(os.getcwd())\nanswer = 42", 1: DOUBLE},
             "deadlock": {0: "answer = 42", 1: DEADLOCK},
             "eof": {0: "answer = 42", 1: EOF_ON_RANK_1}}
    for name, answers in cases.items():
        (folder / f"{name}.ipynb").write_text(json.dumps(answered_notebook(TINY, answers)))
    results = {r.file.rsplit("/", 1)[1][:-6]: r for r in grade_folder(
        folder, time_limit=5, chapters=[chapter], trusted=TRUSTED)}
    crash = results["crash"]   # restarted, the cells before replayed: the ranks' exercise passes
    assert verdicts(crash) == [False, True] and "kernel died" in crash.exercises[0].feedback[0]
    assert verdicts(results["delete"]) == [True, True]   # the folder is back for the ranks
    deadlock = results["deadlock"]   # a hang on the ranks: interrupted, no rank left
    assert verdicts(deadlock) == [True, False]
    assert "time limit of 5 s" in deadlock.exercises[1].feedback[0]
    eof = results["eof"].exercises[1]   # the rank's traceback is kept, trimmed, and folded
    assert not eof.passed and "EOFError on rank 1" in eof.feedback[0], eof
    assert "traceback from rank 1" in eof.details and ", in double" in eof.details, eof.details
    assert "\nEOFError" in eof.details and len(eof.details) < 6000
    page = write_gradebook(list(results.values()), tmp_path / "book")[1].read_text()
    assert "<summary>what your code left: traceback and output (trimmed)</summary>" in page
    assert rank_processes() == []
