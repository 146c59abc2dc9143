"""Grade submitted notebooks: each exercise's check, on the student's answer, on real ranks.

A submission's chapter comes from its content (the student edition's ``course`` metadata, else
the chapter whose markdown it shares most), never from its file name. Each exercise's answer is
read from the submitted cell holding the same ``check_*`` calls: the cell's other statements,
minus those the published cell has too. Each submission runs in a sandbox of its own
(:mod:`tools.classroom.sandbox`), where ``grade_one`` runs the *original* chapter's cells in one
kernel and, at each exercise, the published cell with the student's answer in place of the
stub, in a copy of the namespace, each name the exercise asks for recorded
(:mod:`tools.classroom.replay`). A second sandbox with no student code runs the published
chapter and, at each exercise, the published check on those names replayed from the records:
every verdict and expected value comes from there (an answer that is a class, not replayable,
is checked inside the submission's sandbox and says so). A time
limit, an output cap or a dead kernel fails that exercise only; a dead or killed kernel is
restarted and the cells before are replayed. Where no sandbox can be made, untrusted work is
refused (:class:`SandboxUnavailable`) unless ``trusted``.
"""
from __future__ import annotations

import ast
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tools.classroom.edition import CHAPTERS, _source, find_exercises
from tools.classroom.reach import why_unreachable
from tools.classroom.sandbox import FIRST_UID, Sandbox, sweep_stale, why_not

from exercise_cells import _is_stub, stubs, with_answer  # noqa: E402  (edition put tests/ on sys.path)

SETUP_LIMIT = 300.0   # seconds for one of the chapter's own cells (nbval's cell timeout)
MAX_NOTEBOOK_BYTES = 64 << 20
RESULT_CAP = 256 << 20   # bytes a sandbox may send back (an answer's records, base64)
PROTECTED = re.compile(r"^(check_\w*|__record|__course_\w*|Feedback|get_ipython)$")
@dataclass
class ExerciseResult:
    name: str
    passed: bool
    feedback: list[str]
    seconds: float = 0.0
    review: bool = False   # decided inside the submission's sandbox: the teacher's, not counted
    details: str = ""      # what a failure left (a rank's traceback, trimmed): folded in the page


@dataclass
class Result:
    file: str
    chapter: str | None
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None       # the grader could not grade it at all (not a notebook, ...)
    seconds: float = 0.0

    @property
    def score(self) -> int:
        """Exercises passed, counting only verdicts made outside the submission."""
        return sum(e.passed for e in self.exercises if not e.review)

    @property
    def possible(self) -> int:
        return sum(not e.review for e in self.exercises)


def _checks(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id.startswith("check_") for n in ast.walk(node))


def _binds(node: ast.stmt) -> set[str]:
    found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            found |= set(n.names)
    return found


def exercise_name(source: str, index: int) -> str:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id.startswith("check_"):
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    return str(kw.value.value)
    return f"exercise {index + 1}"


def identify(nb: dict, chapters: list[Path] = CHAPTERS) -> Path | None:
    """The chapter (one of ``chapters``) a submitted notebook belongs to, from its content."""
    by_stem = {p.stem: p for p in chapters}
    named = nb.get("metadata", {}).get("course", {}).get("chapter")
    if named in by_stem:
        return by_stem[named]
    mine = {_source(c).strip() for c in nb.get("cells", []) if c.get("cell_type") == "markdown"}
    best, share = None, 0.0
    for path in chapters:
        theirs = [_source(c).strip() for c in json.loads(path.read_text())["cells"]
                  if c["cell_type"] == "markdown" and "<summary>Solution" not in _source(c)]
        got = sum(t in mine for t in theirs) / max(len(theirs), 1)
        if got > share:
            best, share = path, got
    return best if share >= 0.3 else None


def _check_statements(source: str, *, text: bool = False) -> list[str]:
    """The top-level statements that call a check: as ASTs (formatting ignored), or as text."""
    tree = ast.parse(source)
    return [ast.get_source_segment(source, n) if text else ast.dump(n)
            for n in tree.body if _checks(n)]


def extract_answer(published: str, submitted: str) -> str:
    """The student's answer code in ``submitted`` (their version of the ``published`` cell).

    Raises ValueError with the message the student sees when there is no usable answer.
    """
    try:
        tree = ast.parse(submitted)
    except SyntaxError as err:
        raise ValueError(f"your cell has a syntax error (line {err.lineno}): {err.msg}") from None
    kept = {ast.dump(n) for n in ast.parse(published).body if not _is_stub(n)}
    answer = [n for n in tree.body if not _checks(n) and ast.dump(n) not in kept]
    rebinds = sorted({name for n in answer for name in _binds(n) if PROTECTED.match(name)})
    if rebinds:
        raise ValueError(f"your cell redefines {', '.join(rebinds)}, which the grader keeps: "
                         "write only your answer there")
    code = ast.unparse(ast.Module(body=answer, type_ignores=[]))
    with_answer(published, code)  # raises ValueError if the answer binds none of the stub's names
    return code


def find_answers(published: list, submitted_cells: list[dict]) -> list[str | ValueError]:
    """For each published exercise (in order), the answer code or the reason there is none."""
    code = [_source(c) for c in submitted_cells if c.get("cell_type") == "code"]
    found, start = [], 0
    for exercise in published:
        wanted = _check_statements(exercise.source)
        for j in range(start, len(code)):
            try:
                match = _check_statements(code[j]) == wanted
            except SyntaxError:  # the answer does not parse: find the cell by its check's text
                match = all(w in code[j] for w in _check_statements(exercise.source, text=True))
            if match:
                try:
                    found.append(extract_answer(exercise.source, code[j]))
                except ValueError as err:
                    found.append(err)
                start = j + 1
                break
        else:
            found.append(ValueError("the exercise cell is missing (its check call was changed "
                                    "or deleted)"))
    return found


def _setup_code(cell: dict, is_exercise: bool) -> str:
    """A published cell as it runs before the next one: an exercise cell without its checks."""
    source = _source(cell)
    if not is_exercise:
        return source
    return ast.unparse(ast.Module([n for n in ast.parse(source).body if not _checks(n)], []))


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made here and the work was not declared trusted."""


class EnvironmentUnreachable(SandboxUnavailable):
    """Sandboxes can be made, but the interpreter's environment cannot be shown in them
    (:func:`tools.classroom.reach.why_unreachable`): nothing is graded."""


ROOT = str(Path(__file__).resolve().parents[2])   # the course's folder, read-only in a sandbox


def _refuse_unreachable(hide: tuple) -> None:
    reason = why_unreachable(readonly=(ROOT,), hide=hide)
    if reason is not None:
        raise EnvironmentUnreachable(f"cannot grade here: {reason}")


MAX_DETAILS = 6000   # characters of a failure's traceback and output kept in the feedback


def _details(verdict: dict) -> str:
    """What the failures of one run left (tracebacks, a rank's output), trimmed, or ''."""
    parts = [str(d) for d in verdict.get("details") or [] if d] if isinstance(
        verdict.get("details"), list) else []
    parts.append(str(verdict.get("trace") or ""))
    text = "\n\n".join(p.strip() for p in parts if p.strip())
    return text if len(text) <= MAX_DETAILS else text[:MAX_DETAILS] + "\n... (cut)"


def _exercise_verdict(entry: dict, judged: dict | None, replayed: bool, time_limit: float,
                      cap: int) -> tuple[bool, list[str], str]:
    """The verdict: from the clean judge's run of the published check on what the submission's
    answer produced (``judged``), or, for a class answer (``replayed`` False), from inside; its
    feedback lines, and what a failure left (:func:`_details`)."""
    if entry.get("limit") == "time":
        return False, [f"stopped after the time limit of {time_limit:g} s"], ""
    if entry.get("limit") == "output":
        return False, [f"stopped: it printed more than {cap:,} characters"], ""
    if entry.get("limit") == "died":
        return False, ["the kernel died while your code ran (os._exit, a crash, a kill or the "
                       "memory limit)"], ""
    if entry.get("error"):
        return False, [f"the grader could not run the cell: {entry['error']}"], ""
    if isinstance(entry.get("records"), str):
        return False, [entry["records"]], ""
    inside = entry.get("inside") if isinstance(entry.get("inside"), dict) else {}
    if replayed and inside.get("error"):   # the answer itself raised before its checks
        return False, [f"your code raised {str(inside['error'])[:300]}"], _details(inside)
    verdict = judged if replayed else inside
    try:
        passed = [bool(p) for p in verdict["passed"]]
        lines = [str(m)[:2000] for m in verdict["messages"]]
        error = verdict["error"]
    except (KeyError, TypeError):
        return False, ["the check did not report a verdict"], ""
    if error:
        lines.append(f"your code raised {str(error)[:300]}" if not replayed or
                     not str(error).startswith("the check") else str(error)[:300])
    if not replayed:
        lines.append("(checked inside your sandbox: this answer cannot be judged by a separate "
                     "run, so this verdict is advice only; your teacher reviews it, and it is not "
                     "counted)")
    ok = bool(passed) and all(passed) and not error
    # what the failure left: from the run of the learner's own code (its sandbox: the judge's
    # replay knows only the exception's type and message); text, shown escaped, never a verdict
    return ok, lines or ["the check did not run"], "" if ok else (
        _details(inside) or _details(verdict))


def _recording(published: str, answer: str, names: list[tuple[str, bool]]) -> str:
    """The cell with the answer in place of the stub and each asked-for name recorded (in the
    sandbox) just before the first statement that calls a check."""
    tree = ast.parse(with_answer(published, answer))
    first = next((k for k, n in enumerate(tree.body) if _checks(n)), len(tree.body))
    lines = [ast.parse(f"{n} = __course_record({n}, {n!r}, __course_folder, {f})").body[0]
             for n, f in names]
    tree.body[first:first] = lines
    return ast.unparse(ast.fix_missing_locations(tree))


def _judging(published: str, names: list[tuple[str, bool]]) -> str:
    """The published cell with each asked-for name replayed (in the clean kernel)."""
    code = "\n".join(f"{n} = __course_replay({n!r}, __course_folder, {f})" for n, f in names)
    return with_answer(published, code)


def _job(published: list, exercises: list, answers: list, time_limit: float,
         output_cap: int) -> dict:
    at = {e.cell for e in exercises}
    cells = []
    for i, cell in enumerate(published):
        code = cell["cell_type"] == "code"
        cells.append({"type": cell["cell_type"], "source": _source(cell) if code else "",
                      "setup": _setup_code(cell, i in at) if code else ""})
    names, replayable = [], []
    for e in exercises:
        values, functions = stubs(e.source)
        names.append([(n, False) for n in values] + [(n, True) for n in functions])
        replayable.append(not any(isinstance(n, ast.ClassDef) and _is_stub(n)
                                  for n in ast.parse(e.source).body)
                          and not published[e.cell].get("metadata", {}).get("exercise_review"))
    return {"cells": cells, "time_limit": time_limit, "output_cap": output_cap,
            "setup_limit": SETUP_LIMIT,
            "exercises": [{"cell": e.cell, "replay": r, "judge": _judging(e.source, n)}
                          for e, n, r in zip(exercises, names, replayable)],
            "answers": [{"error": str(a), "code": None} if isinstance(a, ValueError) else
                        {"error": None, "code": _recording(e.source, a, n if r else [])}
                        for a, e, n, r in zip(answers, exercises, names, replayable)]}


_UIDS = iter(range(FIRST_UID + (os.getpid() % 1000) * 1000, FIRST_UID + 2_000_000))
_UIDS_LOCK = threading.Lock()   # submissions are graded in threads (grade_folder's ``jobs``)


def _next_uid() -> int:
    with _UIDS_LOCK:
        return next(_UIDS)


def default_jobs() -> int:
    """Submissions graded at once: one per usable core (each sandbox is held to one CPU),
    fewer where memory would not hold a sandbox's 2 GiB limit plus 1 GiB for each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 3 << 30
    return max(1, min(cores or 1, memory // (3 << 30)))


def _run_sandboxed(job: dict, *, trusted: bool, hide: tuple, output_cap: int) -> dict:
    """Run ``grade_one`` on ``job`` (in a fresh sandbox unless ``trusted`` and none can be
    made); returns the sandbox's report (:meth:`Sandbox.run`)."""
    root = ROOT
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": root,
           "COURSE_ALLOW_SHARED_LOOPBACK": "1",  # the sandbox's loopback is its own
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "LANG": "C.UTF-8",
           "PYDEVD_DISABLE_FILE_VALIDATION": "1", "JUPYTER_PLATFORM_DIRS": "1"}
    for key in ("VIRTUAL_ENV", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        if key in os.environ:
            env[key] = os.environ[key]
    argv = [sys.executable, "-m", "tools.classroom.grade_one"]
    budget = len(job["exercises"]) * job["time_limit"] + SETUP_LIMIT * 2 + 60
    stdin = json.dumps(job).encode()
    if why_not() is None:
        _refuse_unreachable(hide)
        with Sandbox(_next_uid(), hide=hide, readonly=(root,)) as box:
            return box.run(argv, env=env, stdin=stdin, timeout=budget,
                           output_cap=output_cap, result_cap=RESULT_CAP)
    if not trusted:
        raise SandboxUnavailable(f"no sandbox here: {why_not()}")
    return _run_trusted(argv, env, stdin, budget, output_cap)


def _run_trusted(argv, env, stdin, budget, output_cap) -> dict:
    """The same runner as a plain subprocess: for work declared trusted (no isolation)."""
    import subprocess
    import tempfile
    read, write = os.pipe()
    home = tempfile.mkdtemp(prefix="course-grade-")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, pass_fds=(write,), cwd=home,
                                env={**{k: v for k, v in env.items()
                                        if k != "COURSE_ALLOW_SHARED_LOOPBACK"},
                                     "HOME": home, "COURSE_RESULT_FD": str(write)},
                                start_new_session=True)
        os.close(write)
        proc.stdin.write(stdin)
        proc.stdin.close()
        with os.fdopen(read, "rb") as f:
            result = f.read(RESULT_CAP)
        code = proc.wait(budget)
    finally:
        import shutil
        shutil.rmtree(home, ignore_errors=True)
    return {"code": code, "output": b"", "result": result, "limit": None}


def _judge(job: dict, chapter: Path, *, trusted: bool, hide: tuple, output_cap: int
           ) -> list | str:
    """The verdicts of the published checks on the replayed answers, from a clean kernel in a
    sandbox of its own; a string when the published chapter itself failed there."""
    report = _run_sandboxed(job, trusted=trusted, hide=hide, output_cap=output_cap)
    try:
        got = json.loads(report["result"].decode("utf-8"))
    except ValueError:
        got = None
    if isinstance(got, dict) and "published_failed" in got:
        return f"{chapter.stem} {got['published_failed']}"
    if not (isinstance(got, list) and len(got) == len(job["exercises"])):
        return f"{chapter.stem}: the grader's run of the published checks gave no verdicts"
    return got


def grade_notebook(path: Path, *, time_limit: float = 120.0, output_cap: int = 100_000,
                   chapters: list[Path] = CHAPTERS, trusted: bool = False,
                   hide: tuple = ()) -> Result:
    """Grade one submitted notebook against the published ``chapters`` (default: the course's),
    in a sandbox of its own (:mod:`tools.classroom.sandbox`); the verdicts are computed here."""
    start = time.monotonic()
    try:
        if Path(path).stat().st_size > MAX_NOTEBOOK_BYTES:
            return Result(str(path), None, error=f"larger than {MAX_NOTEBOOK_BYTES:,} bytes")
        nb = json.loads(Path(path).read_text())
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return Result(str(path), None, error=f"not a readable notebook: {err}")
    chapter = identify(nb, chapters)
    if chapter is None:
        return Result(str(path), None, error="no chapter of the course matches this notebook")
    published = json.loads(chapter.read_text())["cells"]
    exercises = find_exercises(published)
    answers = find_answers(exercises, cells)
    result = Result(str(path), chapter.stem)
    names = [exercise_name(e.source, k) for k, e in enumerate(exercises)]
    job = _job(published, exercises, answers, time_limit, output_cap)
    report = _run_sandboxed({**job, "mode": "answers"}, trusted=trusted, hide=hide,
                            output_cap=output_cap)
    try:
        entries = json.loads(report["result"].decode("utf-8")) if report["result"] else None
    except ValueError:
        entries = None
    if isinstance(entries, dict) and "published_failed" in entries:  # not the student's doing
        failed = f"{chapter.stem} {str(entries['published_failed'])[:500]}"
        result.error = failed
        result.exercises = [ExerciseResult(n, False, [f"not graded: {failed}"]) for n in names]
        return result
    if not isinstance(entries, list) or len(entries) != len(exercises) or \
            not all(isinstance(e, dict) for e in entries):
        why = {"time": "the submission ran past its time budget",
               "output": f"it printed more than {output_cap:,} bytes outside its cells' output"
               }.get(report["limit"], "its sandbox ended without a report")
        result.error = f"not graded: {why}"
        entries = [{"error": why}] * len(exercises)
    records = [e.get("records") if isinstance(e.get("records"), dict) else None for e in entries]
    judged: list | str = [None] * len(exercises)
    if any(r is not None for r in records):  # a second sandbox, no student code: the verdicts
        judged = _judge({**job, "mode": "judge", "answers": [], "records": records},
                        chapter, trusted=trusted, hide=hide, output_cap=output_cap)
    if isinstance(judged, str):  # the published chapter itself failed under the grader
        result.error = judged
        result.exercises = [ExerciseResult(n, False, [f"not graded: {judged}"]) for n in names]
        return result
    for k, (name, entry) in enumerate(zip(names, entries)):
        if isinstance(answers[k], ValueError):
            passed, lines, details = False, [str(answers[k])], ""
        else:
            passed, lines, details = _exercise_verdict(
                entry, judged[k], job["exercises"][k]["replay"], time_limit, output_cap)
        review = not job["exercises"][k]["replay"] and not isinstance(answers[k], ValueError)
        result.exercises.append(ExerciseResult(name, passed, lines, review=review,
                                               details=details))
    result.seconds = time.monotonic() - start
    return result


def grade_folder(folder: Path, *, time_limit: float = 120.0, output_cap: int = 100_000,
                 chapters: list[Path] = CHAPTERS, trusted: bool = False, hide: tuple = (),
                 progress: Callable[[str], None] = lambda line: None,
                 jobs: int | None = None) -> list[Result]:
    """Grade every ``*.ipynb`` under ``folder``, each in a sandbox of its own, ``jobs`` of them
    at once (default :func:`default_jobs`); one that cannot be graded is reported, not fatal.
    Raises :class:`SandboxUnavailable` before grading anything where no sandbox can be made,
    unless ``trusted``, and :class:`EnvironmentUnreachable` where the interpreter's environment
    cannot be shown in one (:mod:`tools.classroom.reach`). The results (and ``progress`` lines) come in the files' sorted order."""
    reason = why_not()
    if reason is not None and not trusted:
        raise SandboxUnavailable(
            f"cannot grade untrusted work here: {reason}. Each submission needs a sandbox "
            "(its own user, cgroup and namespaces; run the grader as root on Linux). Pass "
            "--trusted only for work you trust: then submissions run as you, unconfined")
    hide = (str(folder), *map(str, hide))
    if reason is None:
        _refuse_unreachable(hide)   # one line naming the path and the fix, before any grading
        sweep_stale()  # sandboxes left by a grader that was killed
    paths = sorted(p for p in Path(folder).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

    def one(path: Path) -> Result:
        try:
            return grade_notebook(path, time_limit=time_limit, output_cap=output_cap,
                                  chapters=chapters, trusted=trusted, hide=hide)
        except Exception as err:  # noqa: BLE001 - the batch goes on
            return Result(str(path), None, error=f"{type(err).__name__}: {err}")

    results = []
    with ThreadPoolExecutor(max(1, min(jobs or default_jobs(), len(paths) or 1))) as pool:
        for path, result in zip(paths, pool.map(one, paths)):
            results.append(result)
            progress(f"{path}: {result.chapter or '?'} {result.score}/{result.possible} "
                     f"({result.seconds:.0f} s){' ' + result.error if result.error else ''}")
    return results
