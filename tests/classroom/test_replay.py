"""The grader's verdicts come from replaying what an answer produced: the replay must give every
exercise's solution the verdict the check gives it in the notebook (PASS), and each listed
mistake its NOT YET, on real ranks. Each function exercise's cell runs here twice, without its
chapter: recording the answer (as the sandbox does), then the published check with the answer
replayed from the records (as the grader's clean kernel does); exercises whose cell needs an
earlier cell of its chapter are left to ``test_grader.py`` / ``test_hostile.py``."""
from __future__ import annotations

import json
from pathlib import Path
import shutil
import tempfile

import pytest
import torch

from course_lib.exercises import Feedback
from tools.classroom.edition import CHAPTERS
from tools.classroom.grade import _job
from tools.classroom.replay import Recorded, Replayed, record, replay

from exercise_cells import find_exercises, stubs

PRELUDE = ("import torch\nimport torch.distributed as dist\nfrom torch import nn\n"
           "import torch.nn.functional as F\nfrom course_lib import *\n")


def _cases():
    for chapter in CHAPTERS:
        cells = json.loads(chapter.read_text())["cells"]
        exercises = find_exercises(cells)
        for k, e in enumerate(exercises):
            if stubs(e.source)[1]:
                for label, code in [("solution", e.solution), *e.wrongs[:1]]:
                    yield pytest.param(cells, exercises, k, label, code,
                                       id=f"{chapter.stem[:2]}-{k}-{label}")


def _run(code: str, names: dict) -> list[bool]:
    seen = []
    ns = {"__record": lambda v: (seen.append(v) if isinstance(v, Feedback) else None, v)[1],
          **names}
    exec(PRELUDE, ns)
    exec(code, ns)
    return [f.passed for f in seen]


@pytest.mark.parametrize("cells, exercises, k, label, code", list(_cases()))
def test_a_replayed_answer_gets_the_verdict_it_gets_in_the_notebook(cells, exercises, k, label,
                                                                    code):
    answers = [e.solution for e in exercises]
    answers[k] = code
    job = _job(cells, exercises, answers, 60, 10 ** 6)
    if not job["exercises"][k]["replay"]:
        pytest.skip("a class answer is checked inside the sandbox")
    folder = tempfile.mkdtemp()
    try:
        try:
            inside = _run(job["answers"][k]["code"], {"__course_record": record,
                                                      "__course_folder": folder})
        except NameError as err:
            pytest.skip(f"needs an earlier cell of its chapter ({err})")
        replayed = _run(job["exercises"][k]["judge"], {"__course_replay": replay,
                                                       "__course_folder": folder})
    finally:
        shutil.rmtree(folder)
    if label == "solution" and not all(inside):   # a NameError on the ranks
        pytest.skip("its solution needs an earlier cell of its chapter")
    assert inside and replayed == inside, (inside, replayed)
    assert all(replayed) == (label == "solution"), replayed


def test_a_call_the_sandbox_did_not_make_fails_and_an_input_returned_stays_that_input():
    folder = tempfile.mkdtemp()
    try:
        params = [torch.zeros(2), torch.ones(3)]
        Recorded(lambda ps, cap: [[ps[1]], [ps[0]]], "buckets", folder)(params, 4)
        theirs = [torch.zeros(2), torch.ones(3)]   # the clean kernel's own parameters
        got = Replayed("buckets", folder)(theirs, 4)
        assert got[0][0] is theirs[1] and got[1][0] is theirs[0]
        with pytest.raises(RuntimeError, match="not called this way in your sandbox"):
            Replayed("buckets", folder)(theirs, 4)
    finally:
        shutil.rmtree(folder)


def test_in_place_changes_and_gradients_are_replayed():
    folder = tempfile.mkdtemp()
    try:
        model = torch.nn.Linear(2, 1)
        model.weight.grad = torch.ones(1, 2)

        def halve(m):
            for p in m.parameters():
                if p.grad is not None:
                    p.grad /= 2
        Recorded(halve, "halve", folder)(model)
        clean = torch.nn.Linear(2, 1)
        clean.weight.grad = torch.full((1, 2), 7.0)
        Replayed("halve", folder)(clean)
        assert torch.equal(clean.weight.grad, torch.full((1, 2), 0.5))   # what it did there
    finally:
        shutil.rmtree(folder)


def test_a_path_below_a_path_argument_is_replayed_below_the_clean_checks_own(tmp_path):
    # chapter 06's check copies the crashed run into a fresh temp folder, then calls fn(copy)
    folder = str(tmp_path / "records")
    (tmp_path / "records").mkdir()
    pick = Recorded(lambda root: (Path(root) / "step_000004", root + "/step_000002", root),
                    "latest", folder)
    pick(str(tmp_path / "sandbox_copy"))
    got = Replayed("latest", folder)(str(tmp_path / "clean_copy"))
    assert got == (tmp_path / "clean_copy" / "step_000004",
                   str(tmp_path / "clean_copy" / "step_000002"), str(tmp_path / "clean_copy"))


def test_values_replay_as_they_were_stub_included(tmp_path):
    for k, value in enumerate([..., None, 42, 2.5, "step_000004", [1, (2, "x")], {"a": 1.0},
                               torch.arange(3)]):
        record(value, f"v{k}", str(tmp_path), False)
        got = replay(f"v{k}", str(tmp_path), False)
        assert type(got) is type(value) and (torch.equal(got, value) if k == 7 else got == value)
    record({1, 2}, "a_set", str(tmp_path), False)   # not plain data: an opaque stand-in
    assert repr(replay("a_set", str(tmp_path), False)).startswith("<a set")


def test_a_class_answer_is_not_recorded_and_says_where_it_was_checked():
    from tools.classroom.grade import _exercise_verdict
    [chapter] = [c for c in CHAPTERS if c.stem.startswith("02")]
    cells = json.loads(chapter.read_text())["cells"]
    exercises = find_exercises(cells)
    job = _job(cells, exercises, [e.solution for e in exercises], 60, 10 ** 6)
    [k] = [k for k, e in enumerate(exercises) if "class MyDDP" in e.source]
    assert not job["exercises"][k]["replay"] and "__course_record" not in job["answers"][k]["code"]
    assert all(x["replay"] for j, x in enumerate(job["exercises"]) if j != k)
    entry = {"inside": {"passed": [True], "messages": ["[DDP by hand] PASS: ..."], "error": None}}
    passed, lines, _details = _exercise_verdict(entry, None, False, 60, 10 ** 6)
    assert passed and "checked inside your sandbox" in lines[-1] and "not counted" in lines[-1]


def test_a_value_measured_in_the_learners_own_run_is_for_review():
    """An exercise whose expected value is the learner's own measurement (cell metadata
    ``exercise_review``) is not replayed: a separate clean run would measure another value. No
    chapter has one today (chapter 05's busbw became a fixed case), so one is marked here."""
    [chapter] = [c for c in CHAPTERS if c.stem.startswith("05")]
    cells = json.loads(chapter.read_text())["cells"]
    exercises = find_exercises(cells)
    assert not any(cells[e.cell]["metadata"].get("exercise_review") for e in exercises)
    replayed = [k for k, x in enumerate(_job(cells, exercises, [e.solution for e in exercises],
                                             60, 10 ** 6)["exercises"]) if x["replay"]]
    marked = replayed[0]
    cells[exercises[marked].cell]["metadata"]["exercise_review"] = "the learner's own timing"
    job = _job(cells, exercises, [e.solution for e in exercises], 60, 10 ** 6)
    assert [k for k, x in enumerate(job["exercises"]) if x["replay"]] == \
        [k for k in replayed if k != marked]


def test_a_verdict_made_inside_the_submission_is_for_review_and_not_counted(tmp_path):
    from tools.classroom.grade import ExerciseResult, Result
    from tools.classroom.gradebook import write_gradebook
    faked = Result("s.ipynb", "02_data_parallel", [ExerciseResult("ring", False, ["not yet"]),
                                                  ExerciseResult("DDP by hand", True, ["PASS"],
                                                                 review=True)])
    assert (faked.score, faked.possible) == (0, 1)   # a faked class verdict adds nothing
    csv_path, html_path = write_gradebook([faked], tmp_path)
    row = csv_path.read_text().splitlines()[1].split(",")
    assert row[2:6] == ["0", "review", "0", "1"], row
    assert "to review (its own check said passed)" in html_path.read_text()
