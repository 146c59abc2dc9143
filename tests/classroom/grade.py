"""Grade submitted notebooks: each exercise's check, on the student's answer, on real ranks.

A submission's chapter comes from its content (the student edition's ``course`` metadata, else
the chapter whose markdown it shares most), never from its file name. Each exercise's answer is
read from the submitted cell holding the same ``check_*`` calls: the cell's other statements,
minus those the published cell has too. In one fresh kernel (``session.Session``) the *original*
chapter's cells run in order, so a student cannot change the setup or the check; at each exercise
the published cell with the student's answer in place of the stub runs in a copy of the
namespace, its ``check_*`` results recorded. A time limit, an output cap or a dead kernel fails
that exercise only; a dead or killed kernel is restarted and the cells before are replayed.
"""
from __future__ import annotations

import ast
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.classroom.edition import CHAPTERS, _source, find_exercises
from tests.classroom.session import Session

from exercise_cells import _is_stub, with_answer  # noqa: E402  (edition put tests/ on sys.path)

SETUP_LIMIT = 300.0   # seconds for one of the chapter's own cells (nbval's cell timeout)
PROTECTED = re.compile(r"^(check_\w*|__record|__course_\w*|Feedback|get_ipython)$")
_GRADE = '''\
def __course_grade(code):
    import json
    from IPython import get_ipython
    from course_lib.exercises import Feedback
    seen, error = [], None
    ns = dict(get_ipython().user_ns)
    ns["__record"] = lambda v: (seen.append(v) if isinstance(v, Feedback) else None, v)[1]
    try:
        exec(compile(code, "<your answer>", "exec"), ns)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return json.dumps({"passed": [bool(f.passed) for f in seen],
                       "messages": [str(f) for f in seen], "error": error})
'''


@dataclass
class ExerciseResult:
    name: str
    passed: bool
    feedback: list[str]
    seconds: float = 0.0


@dataclass
class Result:
    file: str
    chapter: str | None
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None       # the grader could not grade it at all (not a notebook, ...)
    seconds: float = 0.0

    @property
    def score(self) -> int:
        return sum(e.passed for e in self.exercises)


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


def _verdict(outcome, time_limit: float, cap: int) -> tuple[bool, list[str]]:
    if outcome.limit == "time":
        return False, [f"stopped after the time limit of {time_limit:g} s"]
    if outcome.limit == "output":
        return False, [f"stopped: it printed more than {cap:,} characters"]
    if outcome.limit == "died" or outcome.error and outcome.error.startswith("killed"):
        return False, ["the kernel died while your code ran (os._exit, a crash or a kill); "
                       "the grader restarted it"]
    if outcome.error:
        return False, [f"the grader could not run the cell: {outcome.error}"]
    raw = outcome.expressions.get("v", {})
    if raw.get("status") != "ok":
        return False, ["the check did not report a verdict"]
    report = json.loads(ast.literal_eval(raw["data"]["text/plain"]))
    lines = list(report["messages"])
    if report["error"]:
        lines.append(f"your code raised {report['error']}")
    passed = bool(report["passed"]) and all(report["passed"]) and not report["error"]
    return passed, lines or ["the check did not run"]


def grade_notebook(path: Path, *, time_limit: float = 120.0, output_cap: int = 100_000,
                   chapters: list[Path] = CHAPTERS) -> Result:
    """Grade one submitted notebook against the published ``chapters`` (default: the course's)."""
    start = time.monotonic()
    try:
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
    try:
        _grade_cells(published, exercises, answers, names, result, chapter.stem, time_limit,
                     output_cap)
    except RuntimeError as err:  # a published cell failed: grade what is left as not graded
        result.error = str(err)
        result.exercises += [ExerciseResult(name, False, [f"not graded: {err}"])
                             for name in names[len(result.exercises):]]
    result.seconds = time.monotonic() - start
    return result


def _grade_cells(published, exercises, answers, names, result, chapter, time_limit, output_cap):
    at = {e.cell: k for k, e in enumerate(exercises)}
    with Session(output_cap=output_cap) as session:
        replay = False
        for i, cell in enumerate(published[:exercises[-1].cell + 1] if exercises else []):
            if cell["cell_type"] != "code":
                continue
            if replay:
                session.restart()
                for j, before in enumerate(published[:i]):
                    if before["cell_type"] == "code":
                        _run_setup(session, before, j in at, chapter, j)
                replay = False
            if i in at:
                k, t0 = at[i], time.monotonic()
                if isinstance(answers[k], ValueError):
                    passed, lines = False, [str(answers[k])]
                else:
                    code = with_answer(exercises[k].source, answers[k])
                    session.reset_folder()
                    outcome = session.run(f"{_GRADE}__course_verdict = __course_grade({code!r})\n"
                                          "del __course_grade", time_limit=time_limit,
                                          expressions={"v": "__course_verdict"})
                    passed, lines = _verdict(outcome, time_limit, output_cap)
                    replay = not session.alive
                    if not replay:
                        session.reset_folder()
                result.exercises.append(ExerciseResult(names[k], passed, lines,
                                                       time.monotonic() - t0))
                if replay or k == len(exercises) - 1:
                    continue
            _run_setup(session, cell, i in at, chapter, i)


def _run_setup(session: Session, cell: dict, is_exercise: bool, chapter: str, i: int) -> None:
    outcome = session.run(_setup_code(cell, is_exercise), time_limit=SETUP_LIMIT)
    if not outcome.ok:
        raise RuntimeError(f"{chapter} cell {i} (published) failed under the grader: "
                           f"{outcome.error or outcome.limit}")


def grade_folder(folder: Path, *, time_limit: float = 120.0, output_cap: int = 100_000,
                 chapters: list[Path] = CHAPTERS,
                 progress: Callable[[str], None] = lambda line: None) -> list[Result]:
    """Grade every ``*.ipynb`` under ``folder``; one that cannot be graded is reported, not fatal."""
    results = []
    for path in sorted(p for p in Path(folder).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts):
        try:
            result = grade_notebook(path, time_limit=time_limit, output_cap=output_cap,
                                    chapters=chapters)
        except Exception as err:  # noqa: BLE001 - the batch goes on
            result = Result(str(path), None, error=f"{type(err).__name__}: {err}")
        results.append(result)
        progress(f"{path}: {result.chapter or '?'} {result.score}/{len(result.exercises)} "
                 f"({result.seconds:.0f} s){' ' + result.error if result.error else ''}")
    return results
