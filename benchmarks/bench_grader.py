"""How long the autograder takes on a class's batch: 3 submissions x 2 chapters (00 and 01).

    python benchmarks/bench_grader.py [--mode sandbox|trusted|baseline] [--jobs N] [CHAPTER_STEM ...]
    # default: sandbox, as many submissions at once as grade_folder's default (one per core)

``sandbox`` (as root): each submission in its own sandbox, then its answers replayed in a
second, clean sandbox that makes every verdict (issue 49); ``trusted``: the same runner without
a sandbox (``--trusted``); ``baseline``: the in-kernel grader before issue 49 (its ``tests/classroom/grade.py`` read from git, commit
``504d0f9``), all checks in the student's kernel.

Per chapter it grades the solutions, the student edition and one listed mistake (the first
``exercise_wrong`` of the chapter, else the stub of its last exercise kept), each in its own fresh
kernel as ``python -m tools.classroom grade`` does, and prints seconds per notebook, the total
and the load average (the time is dominated by re-running each chapter's published cells, twice
per submission: a chapter's cost is about twice its nbval time).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.classroom.edition import CHAPTERS, answered_notebook, student_notebook  # noqa: E402
from tools.classroom.grade import grade_folder  # noqa: E402

from exercise_cells import find_exercises  # noqa: E402


def batch(chapter: Path, folder: Path) -> None:
    nb = json.loads(chapter.read_text())
    exercises = find_exercises(nb["cells"])
    answers = {k: e.solution for k, e in enumerate(exercises)}
    listed = [(k, code) for k, e in enumerate(exercises) for _, code in e.wrongs]
    if listed:
        answers[listed[0][0]] = listed[0][1]
    else:
        answers.pop(len(exercises) - 1)
    for name, content in [("a", answered_notebook(nb)), ("b", student_notebook(nb, chapter.stem)[0]),
                          ("c", answered_notebook(nb, answers))]:
        (folder / f"{chapter.stem[:2]}{name}.ipynb").write_text(json.dumps(content))


BASELINE = "504d0f9"


def _grader(mode: str, jobs: int | None = None):
    if mode != "baseline":
        return lambda folder, progress: grade_folder(folder, progress=progress,
                                                     trusted=mode == "trusted", jobs=jobs)
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "show", f"{BASELINE}:tests/classroom/grade.py"], cwd=root,
                            capture_output=True, text=True, check=True).stdout
    source = source.replace("tests.classroom.", "tools.classroom.")  # where they live now
    path = Path(tempfile.mkdtemp()) / "grade_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("grade_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return lambda folder, progress: module.grade_folder(folder, progress=progress)


def main(args: list[str]) -> None:
    mode, jobs = "sandbox", None
    while args[:1] in (["--mode"], ["--jobs"]):
        if args[0] == "--mode":
            mode = args[1]
        else:
            jobs = int(args[1])
        args = args[2:]
    stems = args or ["00_start_here", "01_training_memory"]
    grade = _grader(mode, jobs)
    chapters = [p for p in CHAPTERS if p.stem in stems]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for chapter in chapters:
            batch(chapter, folder)
        start = time.monotonic()
        results = grade(folder, print)
        total = time.monotonic() - start
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    for r in results:
        print(f"{Path(r.file).name}: {r.chapter} {r.score}/{r.possible} in {r.seconds:.1f} s")
    label = mode if jobs is None else f"{mode} (jobs {jobs})"
    print(f"{label}: {len(results)} notebooks ({', '.join(stems)}) graded in {total:.1f} s "
          f"(load average {load}, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main(sys.argv[1:])
