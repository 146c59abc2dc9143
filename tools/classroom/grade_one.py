"""``python -m tools.classroom.grade_one``: one run of a chapter inside a sandbox.

Reads a job (JSON on stdin: the published cells, the exercises, the limits) and writes, on the
pipe ``COURSE_RESULT_FD`` (inherited by nothing it starts; this process is made non-dumpable,
so the kernel it starts, same uid, cannot open it through ``/proc``), per exercise:

- ``mode: answers`` (the submission's sandbox): the published cell with the student's answer
  in place of the stub, each name the exercise asks for recorded before the checks run
  (:mod:`tools.classroom.replay`): the record files, sent back as they are; what the checks said
  there (one line each, and what a failure left: :func:`course_lib.exercises.failure_details`)
  is ignored, except for an exercise whose answer is a class (not replayable);
- ``mode: judge`` (a second sandbox, no student code in it): the published chapter, and at each
  exercise its published cell with those names replayed from the records: the verdicts.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys

from tools.classroom.session import Session

_PR_SET_DUMPABLE = 4
MAX_RECORDS = 48 << 20   # bytes of records one exercise may send back

# one cell, in the sandbox (the student's cell, names recorded: what its checks say there is used
# only for an answer that is a class) or in the clean kernel (the published cell, names replayed)
_CELL = '''
def __course_cell(code, folder, label):
    import json
    from IPython import get_ipython
    from course_lib.exercises import Feedback, failure_details
    from tools.classroom.replay import record, replay
    seen, error, trace = [], None, ""
    ns = dict(get_ipython().user_ns)
    ns["__record"] = lambda v: (seen.append(v) if isinstance(v, Feedback) else None, v)[1]
    ns["__course_record"], ns["__course_replay"], ns["__course_folder"] = record, replay, folder
    try:
        exec(compile(code, label, "exec"), ns)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        trace = failure_details(exc)
    return json.dumps({"passed": [bool(f.passed) for f in seen],
                       "messages": [repr(Feedback(f.passed, f.message, f.name)) for f in seen],
                       "details": [str(f.details) for f in seen], "error": error,
                       "trace": trace})
'''


def _expression(outcome, key: str):
    raw = outcome.expressions.get(key, {})
    if raw.get("status") != "ok":
        return None
    import ast
    try:
        return json.loads(ast.literal_eval(raw["data"]["text/plain"]))
    except (ValueError, SyntaxError, TypeError):
        return None


def _records(folder: str) -> dict | str:
    """The record files an exercise left (name -> base64), or why they cannot be sent."""
    import base64
    out, total = {}, 0
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isfile(path) or os.path.islink(path):
            continue
        total += os.path.getsize(path)
        if total > MAX_RECORDS:
            return f"what your answer produced is over {MAX_RECORDS >> 20} MiB"
        with open(path, "rb") as f:
            out[name] = base64.b64encode(f.read()).decode()
    return out


class _PublishedFailed(RuntimeError):
    pass


def _setup(session: Session, job: dict, cell: dict, is_exercise: bool, i: int) -> None:
    outcome = session.run(cell["setup"] if is_exercise else cell["source"],
                          time_limit=job["setup_limit"])
    if not outcome.ok:
        raise _PublishedFailed(f"cell {i} (published) failed under the grader: "
                               f"{outcome.error or outcome.limit}")


def judge(job: dict) -> list:
    """The published chapter alone, in one clean kernel; at each exercise, its published check
    with the learner's names replayed from ``job["records"]``: per exercise the verdicts."""
    import base64
    import shutil
    import tempfile
    cells, exercises = job["cells"], job["exercises"]
    at = {e["cell"]: k for k, e in enumerate(exercises)}
    verdicts = [None] * len(exercises)
    with Session(output_cap=job["output_cap"]) as session:
        for i, cell in enumerate(cells[:exercises[-1]["cell"] + 1] if exercises else []):
            if cell["type"] != "code":
                continue
            k = at.get(i)
            records = job["records"][k] if k is not None else None
            if k is not None and exercises[k]["replay"] and isinstance(records, dict):
                folder = tempfile.mkdtemp(prefix="course-judge-")
                try:
                    for name, data in records.items():
                        if "/" in name or name.startswith("."):
                            continue
                        with open(os.path.join(folder, name), "wb") as f:
                            f.write(base64.b64decode(data))
                    session.reset_folder()
                    outcome = session.run(_CELL + "__course_v = __course_cell("
                                          f"{exercises[k]['judge']!r}, {folder!r}, "
                                          "'<the check>')\ndel __course_cell",
                                          time_limit=job["time_limit"],
                                          expressions={"v": "__course_v"})
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
                verdict = _expression(outcome, "v")
                if not outcome.ok or not isinstance(verdict, dict):
                    verdict = {"passed": [False], "messages": [], "error":
                               f"the check could not run: {outcome.error or outcome.limit}"}
                verdicts[k] = verdict
                if not session.alive:
                    raise _PublishedFailed(f"cell {i}: the grader's kernel died in the check")
                session.reset_folder()
            _setup(session, job, cell, k is not None, i)
    return verdicts


def answers(job: dict) -> list[dict]:
    """The chapter with the student's answers, in one kernel (restarted, the cells before
    replayed, after a death): per exercise what the answer produced (records), no verdict."""
    import shutil
    import tempfile
    cells, exercises, answers = job["cells"], job["exercises"], job["answers"]
    at = {e["cell"]: k for k, e in enumerate(exercises)}
    out = [{"limit": None, "error": None, "inside": None, "records": None} for _ in exercises]
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
                    folder = tempfile.mkdtemp(prefix="course-records-")
                    os.chmod(folder, 0o700)
                    outcome = session.run(_CELL + "__course_v = __course_cell("
                                          f"{answers[k]['code']!r}, {folder!r}, "
                                          "'<your answer>')\ndel __course_cell",
                                          time_limit=job["time_limit"],
                                          expressions={"v": "__course_v"})
                    if outcome.limit or (outcome.error and outcome.error.startswith("killed")):
                        entry["limit"] = outcome.limit or "died"
                    elif outcome.error:
                        entry["error"] = outcome.error
                    else:
                        entry["inside"] = _expression(outcome, "v")
                        entry["records"] = _records(folder)
                    shutil.rmtree(folder, ignore_errors=True)
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
        result = judge(job) if job["mode"] == "judge" else answers(job)
    except _PublishedFailed as err:
        result = {"published_failed": str(err)}
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
