"""Every exercise has a stub and an extractable solution; the both-ways verdict logic is sound.

The checks themselves run both ways inside nbval (``tests/nbval_exercises.py``: one
``Cell N::exercise`` item per exercise, in the notebook's kernel). Here, without a kernel: the
inventory (every check cell has a stub and a Solution block whose code replaces the stub), and
the machinery on a small exercise, including that it catches a wrong solution and a leak.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import IPython
import pytest

from exercise_cells import Exercise, choices, find_exercises, solution_code, stubs, variants
from nbval_exercises import _verify, check_report

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_check_cell_is_an_exercise_with_a_stub_and_a_solution_that_replaces_it(path):
    cells = json.loads(path.read_text())["cells"]
    exercises = find_exercises(cells)
    assert len(exercises) >= 2, f"{path.name}: {len(exercises)} exercises"
    for exercise in exercises:
        built = variants(exercise)  # raises when the stub or the solution is missing
        for code in built.values():
            compile(code, path.name, "exec")
            assert "__record(check_" in code
        assert built["solution"] != built["stub"]
        stored = "".join(_text(o) for o in cells[exercise.cell].get("outputs", []))
        assert re.search(r"\] (TO DO|NOT YET): ", stored) and "] PASS: " not in stored, f"{path.name} cell {exercise.cell}: stored output {stored!r}"


def _text(output: dict) -> str:
    data = output.get("text") or output.get("data", {}).get("text/plain", "")
    return "".join(data) if isinstance(data, list) else data


def test_solutions_come_from_a_fenced_block_or_inline_answer_code():
    fenced = "<details><summary>Solution</summary>\n\n```python\nanswer = 4\n```\nWhy.</details>"
    assert solution_code(fenced) == "answer = 4"
    inline = "Two moments: `answer = 2 * n` (`n` parameters), or `x = 1`."
    assert solution_code(inline) == "answer = 2 * n"
    assert solution_code("`a, b = 1` and `answer_rank0, answer_rank3 = 4, 1`") == \
        "answer_rank0, answer_rank3 = 4, 1"


CELL = '''from course_lib import check_number, check_choice
answer = ...  # your number
print(check_number(answer, 6 * n, name="six n"))
'''


def _run(solution: str, source: str = CELL, n: int = 1000) -> dict:
    exercise = Exercise(0, 0, source, solution)
    fake = SimpleNamespace(user_ns={"n": n})
    original = IPython.get_ipython
    IPython.get_ipython = lambda: fake
    try:
        return json.loads(_verify(variants(exercise), choices(source), stubs(source)[0]))
    finally:
        IPython.get_ipython = original


def test_the_verdict_passes_a_right_solution_and_fails_stub_and_wrong_answer():
    report = _run("answer = 6 * n")
    assert report["solution"]["passed"] == [True]
    assert report["stub"]["passed"] == [False] and report["wrong"]["passed"] == [False]
    check_report(report)


def test_the_verdict_catches_a_wrong_solution_a_raising_check_and_a_leak():
    with pytest.raises(AssertionError, match="the solution does not pass"):
        check_report(_run("answer = 5 * n"))
    with pytest.raises(AssertionError, match="the solution raised NameError"):
        check_report(_run("answer = 6 * m"))
    report = _run("answer = 6 * n")
    report["wrong"]["messages"] = ["[six n] NOT YET: too high, it is 6,000."]
    with pytest.raises(AssertionError, match="shows the solution"):
        check_report(report)


def test_a_multiple_choice_wrong_answer_is_another_option():
    source = ('from course_lib import check_choice\nanswer = ...\n'
              'check_choice(answer, "b", ["a", "b", "c"], name="pick")\n')
    report = _run('answer = "b"', source)
    assert report["solution"]["passed"] == [True] and report["wrong"]["passed"] == [False]
    assert "'a' is not it" in report["wrong"]["messages"][0]


def test_a_function_exercise_fails_with_the_stub_and_with_a_function_that_does_nothing():
    source = '''from course_lib import check_true
def double(x):
    raise NotImplementedError
check_true(lambda: (double(n) == 2 * n, "doubles"), name="double")
'''
    report = _run("def double(x):\n    return 2 * x", source)
    check_report(report)
    assert "NotImplementedError" in report["stub"]["messages"][0]
    assert report["wrong"]["passed"] == [False]


def test_a_class_exercise_is_a_stub_too_and_its_solution_replaces_the_class():
    source = '''from course_lib import check_true
class Doubler:
    def __call__(self, x):
        raise NotImplementedError
check_true(lambda: (Doubler()(n) == 2 * n, "doubles"), name="doubler")
'''
    assert stubs(source) == ([], ["Doubler"])
    report = _run("class Doubler:\n    def __call__(self, x):\n        return 2 * x", source)
    check_report(report)
    assert "NotImplementedError" in report["stub"]["messages"][0]
    assert report["wrong"]["passed"] == [False]   # the class replaced by a function returning None


FN_CELL = '''from course_lib import check_true
def mean_of(xs):
    raise NotImplementedError("your code")
print(check_true(lambda: (mean_of([2.0, 4.0, 9.0]) == 5.0, "compared with 5.0"), name="mean"))
'''


def test_a_plausible_wrong_answer_from_the_cell_metadata_is_run_and_must_fail():
    cells = [{"cell_type": "code", "source": FN_CELL, "outputs": [],
              "metadata": {"exercise_wrong": {"sum instead of mean": "def mean_of(xs):\n"
                                              "    return sum(xs)"}}},
             {"cell_type": "markdown", "metadata": {},
              "source": "<details><summary>Solution</summary>\n\n```python\ndef mean_of(xs):\n"
                        "    return sum(xs) / len(xs)\n```\n</details>"}]
    exercise, = find_exercises(cells)
    assert [kind for kind in variants(exercise)] == \
        ["stub", "solution", "wrong", "wrong: sum instead of mean"]
    fake = SimpleNamespace(user_ns={})
    original = IPython.get_ipython
    IPython.get_ipython = lambda: fake
    try:
        report = json.loads(_verify(variants(exercise), [], []))
    finally:
        IPython.get_ipython = original
    assert report["wrong: sum instead of mean"]["passed"] == [False]
    check_report(report)
    report["wrong: sum instead of mean"]["passed"] = [True]  # a mistake the check misses
    with pytest.raises(AssertionError, match="the wrong: sum instead of mean passes"):
        check_report(report)
