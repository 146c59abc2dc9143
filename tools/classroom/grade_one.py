"""``python -m tools.classroom.grade_one``: one submission's exercises, run inside its sandbox.

Reads a job (JSON on stdin: the published cells, the exercises, the student's answers, the
limits) and writes, on the pipe ``COURSE_RESULT_FD`` (inherited by nothing it starts; this
process is made non-dumpable, so the kernel it starts, same uid, cannot open it through
``/proc``), per exercise:

- ``mode: reference`` (once per chapter and batch, no student code): the arguments of every
  value check (``check_number``, ``check_close``, ``check_choice``) other than the answer, as
  the *published* chapter computes them;
- ``mode: answers`` (each submission): the answer argument of the same calls, evaluated with
  the student's answer in, and what the other checks (``check_true`` and the chapters' own)
  reported: those run with the student's code in the same interpreter, so a submission can fake
  them.

Values cross as the ``repr`` of plain data (numbers, strings, lists, tuples, dicts, tensors as
lists); the grader parses them with ``ast.literal_eval`` and computes the value checks'
verdicts itself (:mod:`tools.classroom.grade`), so nothing a submission patches in its kernel
changes a value check's verdict.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys

from tools.classroom.session import Session

VALUE_CHECKS = ("check_number", "check_close", "check_choice")
_PR_SET_DUMPABLE = 4

_PLAIN = '''
def __course_plain(v, depth=0):
    import math
    import torch
    if depth > 30:
        return ("__unrepresentable__", "nested too deeply")
    if v is None or v is ... or type(v) in (bool, int, str):
        return v
    if type(v) is float:
        return v if math.isfinite(v) else ("__float__", repr(v))
    if isinstance(v, torch.Tensor):
        if v.numel() > 1_000_000:
            return ("__unrepresentable__", "a tensor over 10^6 elements")
        return ("__tensor__", __course_plain(v.detach().cpu().tolist(), depth + 1),
                str(v.dtype).split(".")[-1])
    if type(v).__module__ == "numpy" and hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        return __course_plain(v.item(), depth + 1)
    if type(v) in (list, tuple):
        return type(v)(__course_plain(x, depth + 1) for x in v)
    if type(v) is dict:
        return {__course_plain(k, depth + 1): __course_plain(x, depth + 1) for k, x in v.items()}
    return ("__unrepresentable__", type(v).__name__)
'''

# phase A: the published cell (stubs in place), value checks recorded, other checks not run
_EXPECT = _PLAIN + '''
def __course_expect(code):
    from IPython import get_ipython
    calls = []
    ns = dict(get_ipython().user_ns)
    for name in %r:
        ns[name] = (lambda n: lambda *a, **k: calls.append(
            (n, __course_plain(a[1:]), __course_plain(k))))(name)
    ns["__record"] = lambda v: v
    skip = lambda *a, **k: None
    for name in list(ns):
        if name.startswith("check_") and name not in %r:
            ns[name] = skip
    exec(compile(code, "<published>", "exec"), ns)
    return repr(calls)
''' % (VALUE_CHECKS, VALUE_CHECKS)

# phase B: the student's version; value checks record the answer, the others run (inside)
_ANSWER = _PLAIN + '''
def __course_answer(code):
    import json
    from IPython import get_ipython
    from course_lib.exercises import Feedback
    calls, seen, error = [], [], None
    ns = dict(get_ipython().user_ns)
    for name in %r:
        ns[name] = (lambda n: lambda *a, **k: calls.append(
            (n, __course_plain(a[0] if a else None))))(name)
    ns["__record"] = lambda v: (seen.append(v) if isinstance(v, Feedback) else None, v)[1]
    try:
        exec(compile(code, "<your answer>", "exec"), ns)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return json.dumps({"answers": repr(calls), "passed": [bool(f.passed) for f in seen],
                       "messages": [str(f) for f in seen], "error": error})
''' % (VALUE_CHECKS,)


def _expression(outcome, key: str) -> str | None:
    raw = outcome.expressions.get(key, {})
    if raw.get("status") != "ok":
        return None
    import ast
    return ast.literal_eval(raw["data"]["text/plain"])


class _PublishedFailed(RuntimeError):
    pass


def _setup(session: Session, job: dict, cell: dict, is_exercise: bool, i: int) -> None:
    outcome = session.run(cell["setup"] if is_exercise else cell["source"],
                          time_limit=job["setup_limit"])
    if not outcome.ok:
        raise _PublishedFailed(f"cell {i} (published) failed under the grader: "
                               f"{outcome.error or outcome.limit}")


def reference(job: dict) -> list:
    """The published chapter alone, in one kernel: each exercise's value-check arguments."""
    cells, exercises = job["cells"], job["exercises"]
    at = {e["cell"]: k for k, e in enumerate(exercises)}
    expected = []
    with Session(output_cap=job["output_cap"]) as session:
        for i, cell in enumerate(cells[:exercises[-1]["cell"] + 1] if exercises else []):
            if cell["type"] != "code":
                continue
            if i in at:
                outcome = session.run(_EXPECT + "__course_e = __course_expect("
                                      f"{exercises[at[i]]['published']!r})",
                                      time_limit=job["setup_limit"],
                                      expressions={"e": "__course_e"})
                if not outcome.ok:
                    raise _PublishedFailed(f"cell {i} (published) failed under the grader: "
                                           f"{outcome.error or outcome.limit}")
                expected.append(_expression(outcome, "e"))
            _setup(session, job, cell, i in at, i)
    return expected


def answers(job: dict) -> list[dict]:
    """The chapter with the student's answers, in one kernel (restarted, the cells before
    replayed, after a death): per exercise what the sandbox saw (no verdict)."""
    cells, exercises, answers = job["cells"], job["exercises"], job["answers"]
    at = {e["cell"]: k for k, e in enumerate(exercises)}
    out = [{"limit": None, "error": None, "inside": None} for _ in exercises]
    with Session(output_cap=job["output_cap"]) as session:
        replay = False
        for i, cell in enumerate(cells[:exercises[-1]["cell"] + 1] if exercises else []):
            if cell["type"] != "code":
                continue
            if replay:
                session.restart()
                for j, before in enumerate(cells[:i]):
                    if before["type"] == "code":
                        _setup(session, job, before, j in at, j)
                replay = False
            if i in at:
                k, entry = at[i], out[at[i]]
                if answers[k]["error"] is None:
                    session.reset_folder()
                    outcome = session.run(_ANSWER + "__course_v = __course_answer("
                                          f"{answers[k]['code']!r})\ndel __course_answer",
                                          time_limit=job["time_limit"],
                                          expressions={"v": "__course_v"})
                    if outcome.limit or (outcome.error and outcome.error.startswith("killed")):
                        entry["limit"] = outcome.limit or "died"
                    elif outcome.error:
                        entry["error"] = outcome.error
                    else:
                        try:
                            entry["inside"] = json.loads(_expression(outcome, "v"))
                        except (TypeError, ValueError, SyntaxError):
                            entry["error"] = "the check did not report a verdict"
                    replay = not session.alive
                    if not replay:
                        session.reset_folder()
                if replay or k == len(exercises) - 1:
                    continue
            _setup(session, job, cell, i in at, i)
    return out


def main() -> int:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    fd = int(os.environ.pop("COURSE_RESULT_FD"))
    os.set_inheritable(fd, False)
    job = json.loads(sys.stdin.read())
    try:
        result = reference(job) if job["mode"] == "reference" else answers(job)
    except _PublishedFailed as err:
        result = {"published_failed": str(err)}
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
