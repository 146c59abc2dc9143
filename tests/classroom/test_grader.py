"""The autograder on chapter 00: solutions score all, the student edition none, a mistake fails
its exercise only, and a crash, a hang and a deleted folder are contained. One batch, graded once."""
import csv
import json

import pytest

from tests.classroom.edition import CHAPTERS, answered_notebook, student_notebook
from tests.classroom.grade import extract_answer, grade_folder
from tests.classroom.gradebook import write_gradebook

from processes import rank_processes

CHAPTER = CHAPTERS[0]          # 00: two exercises, a value and a function run on 4 ranks
RIGHT = "answer = 50"
SUM_NOT_MEAN = ("def mean_of_ranks():\n    x = torch.tensor([float(dist.get_rank())])\n"
                "    dist.all_reduce(x)\n    return x.item()")
SOLUTION_2 = ("def mean_of_ranks():\n    x = torch.tensor([float(dist.get_rank())])\n"
              "    dist.all_reduce(x)\n    return (x / dist.get_world_size()).item()")
TIME_LIMIT = 30.0


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    nb = json.loads(CHAPTER.read_text())
    submissions = {   # file names say nothing: the grader finds the chapter in the content
        "s1.ipynb": answered_notebook(nb),
        "s2.ipynb": student_notebook(nb, CHAPTER.stem)[0],
        "s3.ipynb": answered_notebook(nb, {0: RIGHT, 1: SUM_NOT_MEAN}),
        # a crash, then a hang: the grader restarts the kernel, replays the cells, times out
        "s4.ipynb": answered_notebook(nb, {0: "import os\nos._exit(3)\nanswer = 50",
                                           1: "def mean_of_ranks():\n    import time\n"
                                              "    while True:\n        time.sleep(0.1)"}),
        # deleting its folder fails that exercise (the launcher needs a cwd), not the next
        "s5.ipynb": answered_notebook(nb, {0: "import os, shutil\nshutil.rmtree(os.getcwd())\n"
                                              "answer = 50", 1: SOLUTION_2}),
    }
    for name, content in submissions.items():
        (folder / name).write_text(json.dumps(content))
    (folder / "notes.ipynb").write_text("{not json")
    results = {r.file.rsplit("/", 1)[1]: r for r in grade_folder(folder, time_limit=TIME_LIMIT)}
    return results, write_gradebook(list(results.values()), tmp_path_factory.mktemp("book"))


def verdicts(result):
    return [e.passed for e in result.exercises]


def test_the_solutions_score_every_exercise_and_the_student_edition_none(graded):
    results, _ = graded
    assert results["s1.ipynb"].chapter == CHAPTER.stem and verdicts(results["s1.ipynb"]) == [True, True]
    assert verdicts(results["s2.ipynb"]) == [False, False]
    assert all("not answered yet" in " ".join(e.feedback) for e in results["s2.ipynb"].exercises)


def test_a_mistake_fails_exactly_its_exercise_with_the_checks_feedback(graded):
    result = graded[0]["s3.ipynb"]
    assert verdicts(result) == [True, False]
    assert "returned something else than the mean" in " ".join(result.exercises[1].feedback)


def test_a_crash_a_hang_and_a_deleted_folder_are_contained(graded, no_leftover_ranks):
    results, _ = graded
    crash, deleted = results["s4.ipynb"], results["s5.ipynb"]
    assert verdicts(crash) == [False, False] and crash.error is None  # the replay ran
    assert "kernel died" in crash.exercises[0].feedback[0]
    assert "time limit" in crash.exercises[1].feedback[0]
    assert TIME_LIMIT <= crash.exercises[1].seconds
    assert verdicts(deleted) == [False, True]     # the folder is back for exercise 2
    assert "FileNotFoundError" in deleted.exercises[0].feedback[-1]
    assert results["notes.ipynb"].error.startswith("not a readable notebook")


def test_the_gradebook_has_a_row_per_notebook_and_the_feedback_no_solution(graded):
    results, (csv_path, html_path) = graded
    rows = {r["file"].rsplit("/", 1)[1]: r for r in csv.DictReader(csv_path.open())}
    assert rows["s1.ipynb"]["total"] == "2" and rows["s1.ipynb"]["percent_correct"] == "100.0"
    assert rows["s3.ipynb"]["00_start_here: mean of ranks"] == "0"
    assert rows["notes.ipynb"]["error"]
    page = html_path.read_text()
    assert "returned something else than the mean" in page
    assert "dist.all_reduce" not in page and "answer = 50" not in page


def test_an_answer_may_not_redefine_the_check():
    published = json.loads(CHAPTER.read_text())["cells"][23]["source"]
    published = "".join(published)
    with pytest.raises(ValueError, match="redefines check_number"):
        extract_answer(published, published.replace(
            "answer = ...", "check_number = lambda *a, **k: True\nanswer = 1"))
    with pytest.raises(ValueError, match="syntax error"):
        extract_answer(published, published.replace("answer = ...", "answer = = 1"))
