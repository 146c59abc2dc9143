"""pytest plugin: every exercise check fails on the stub and a wrong answer, passes on the solution.

Register with ``-p tests.nbval_exercises`` (pyproject ``addopts``). During an nbval run it adds one
item after each exercise cell, ``<notebook>::Cell N::exercise``. That item runs in the notebook's
own kernel, right after nbval executed the cell, so the measurements the check compares with
already exist and nothing is re-run but the checks themselves. In a *copy* of the kernel's
namespace (later cells see nothing of it) it executes the cell three times, with every
``check_*(...)`` call recorded (see ``tests/exercise_cells.py``):

* ``solution``: the stub replaced by the code of the hidden Solution block: every check passes;
* ``stub``: the cell as the learner gets it: a check fails;
* ``wrong``: the solution's answer perturbed (a number x1.5+1; for a multiple choice another
  option, from the cell or from the stub's "pick one of [...]"), or a function that does
  nothing: a check fails, and its message does not contain the solution's number (no leak);
* ``wrong: <label>``: each plausible mistake named in the cell's ``exercise_wrong`` metadata
  (sum instead of mean, a missing all-gather, ...): a check fails, without a leak.

Then, with the solution's numbers in hand, the page above the exercise (as stored on disk) must
not show them (``tests/answers_on_page.py``; the open set is ``OPEN`` in
``tests/test_no_answer_on_page.py``, which checks everything that needs no kernel).
"""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from queue import Empty

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from answers_on_page import reveals  # noqa: E402
from exercise_cells import choices, find_exercises, stubs, variants  # noqa: E402
from test_no_answer_on_page import OPEN  # noqa: E402

_TAG = "@@course-exercise@@ "


def _verify(codes: dict, candidates: list, names: list) -> str:  # runs inside the kernel
    import ast as _ast
    import json as _json
    import re as _re

    from IPython import get_ipython

    from course_lib.exercises import Feedback

    def wrong(value):
        if isinstance(value, tuple):
            return tuple(wrong(v) for v in value)
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return int(value * 1.5) + 1
        if isinstance(value, float):
            return value * 1.5 + 1
        if isinstance(value, str):
            return next((c for c in candidates if c != value), value + " (wrong)")
        raise TypeError(f"no wrong answer for a {type(value).__name__}")

    report = {}
    for kind in codes:  # stub first: the stub's "pick one of [...]" lists the options
        code = codes[kind]
        seen = []
        ns = dict(get_ipython().user_ns)
        ns["__record"] = lambda v: (seen.append(v) if isinstance(v, Feedback) else None, v)[1]
        ns["__wrong"] = wrong
        error = None
        try:
            exec(compile(code, f"<exercise: {kind}>", "exec"), ns)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            error = f"{type(exc).__name__}: {exc}"
        numbers = [ns.get(n) for n in names]
        numbers = [v for v in numbers if isinstance(v, (int, float)) and not isinstance(v, bool)]
        report[kind] = {"passed": [f.passed for f in seen], "messages": [repr(f) for f in seen],
                        "error": error, "numbers": numbers}
        for f in seen:
            options = _re.search(r"pick one of (\[.*\])", f.message)
            if options:
                candidates = candidates + [c for c in _ast.literal_eval(options.group(1))
                                           if isinstance(c, str)]
    return _json.dumps(report)


class ExerciseItem(pytest.Item):
    def __init__(self, *, exercise, **kwargs):
        super().__init__(**kwargs)
        self.exercise = exercise

    def runtest(self) -> None:
        kernel = self.parent.kernel
        values, _ = stubs(self.exercise.source)
        args = (variants(self.exercise), choices(self.exercise.source), values)
        code = (f"{inspect.getsource(_verify)}\nprint({_TAG!r} + _verify(*{args!r}))\n"
                "del _verify")
        msg_id = kernel.execute_cell_input(code, allow_stdin=False)
        timeout = self.config.option.nbval_cell_timeout
        kernel.await_reply(msg_id, timeout=timeout)
        text, errors = "", []
        while True:
            try:
                msg = kernel.get_message("iopub", timeout=timeout)
            except Empty:
                raise AssertionError("the kernel did not answer") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "stream":
                text += msg["content"]["text"]
            elif kind == "error":
                errors.append("\n".join(msg["content"]["traceback"]))
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert not errors, errors[0]
        line = next((ln for ln in text.split("\n") if ln.startswith(_TAG)), None)
        assert line is not None, f"no verdict from the kernel; it printed: {text[-2000:]}"
        report = json.loads(line[len(_TAG):])
        check_report(report)
        check_page(self.parent.nb.cells, self.exercise, report["solution"]["numbers"],
                   Path(str(self.path)).name[:2])

    def reportinfo(self):
        return self.path, 0, f"{self.name} (cell {self.exercise.cell})"


def check_report(report: dict) -> None:
    """The verdicts: the solution passes, the stub and the wrong answer fail without a leak."""
    solution = report["solution"]
    assert solution["error"] is None, f"the solution raised {solution['error']}"
    assert solution["passed"] and all(solution["passed"]), \
        f"the solution does not pass: {solution['messages']}"
    for kind in [k for k in report if k != "solution"]:
        got = report[kind]
        assert got["error"] is None, f"the {kind} raised {got['error']} (a check must not raise)"
        assert got["passed"] and not all(got["passed"]), f"the {kind} passes: {got['messages']}"
        for value in solution["numbers"]:
            if abs(value) >= 100:  # small numbers appear in any text
                shown = {str(value), f"{value:,}", f"{value:.6g}", f"{value:,.0f}"}
                leaked = [m for m in got["messages"] if any(s in m for s in shown)]
                assert not leaked, f"the {kind}'s feedback shows the solution: {leaked}"


def check_page(cells: list, exercise, numbers: list, chapter: str) -> None:
    """The stored page above the exercise does not show the number its solution computes."""
    if exercise.title in OPEN.get(chapter, {}):
        return
    shown = [f for f in reveals(cells, exercise, numbers) if f.startswith("number:")]
    assert not shown, (f"{chapter} {exercise.title}: the page gives the answer away: {shown} "
                       "(move the output below the exercise or ask for something the page does not show)")


def pytest_collection_modifyitems(session, config, items):
    """After each nbval exercise cell, an item that checks it both ways in the same kernel."""
    out = []
    for item in items:
        out.append(item)
        if type(item).__name__ != "IPyNbCell" or getattr(item, "cell_num", None) is None:
            continue
        cells = getattr(item.parent, "_course_exercises", None)
        if cells is None:
            cells = {e.code_cell: e for e in find_exercises(item.parent.nb.cells)}
            item.parent._course_exercises = cells
        exercise = cells.get(item.cell_num)
        if exercise is not None:
            out.append(ExerciseItem.from_parent(item.parent, name=f"{item.name}::exercise",
                                                exercise=exercise))
    items[:] = out
