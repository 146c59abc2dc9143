"""Chapter 6's code exercise: pick the checkpoint to resume from after a crash mid-save.

:func:`check_latest_committed` runs the learner's ``latest_committed(root)`` on real ranks, in a
copy of a directory that a crashed run left behind (committed ``step_N`` directories and a
``step_N.tmp`` whose save was interrupted), and compares the pick with the course's
:func:`course_lib.fault_tolerance.commit.latest_committed`. A right pick must then load: every
rank reads its shards with :func:`~course_lib.fault_tolerance.commit.load_committed`.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

from course_lib.common.checks import positive_int
from course_lib.exercises import Feedback, check_choice, check_number
from course_lib.fault_tolerance.interval import job_mtbf, young_daly_interval
from course_lib.fault_tolerance.commit import MARKER, latest_committed, load_committed
from course_lib.fault_tolerance.training import build
from course_lib.launcher.launch import run

__all__ = ["check_latest_committed", "check_restart_pick", "check_young_daly", "check_mtbf_at_scale"]


def _resume_rank(fn: Callable, root: str, expected: str, config: str) -> dict:
    """On each rank: the learner's pick; if it is the right one, load it (a real resume)."""
    picked = fn(Path(root))
    if picked is None or Path(picked) != Path(expected):
        return {"picked": None if picked is None else str(picked)}
    model, optimizer = build(config)
    load_committed(picked, model, optimizer)
    return {"picked": str(picked), "loaded": True}


def _name(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def check_latest_committed(fn: Callable, root: str | Path, world: int = 2,
                           config: str = "tiny") -> tuple[bool, str]:
    """Run ``fn(root)`` on ``world`` ranks in a copy of ``root``; it must pick the last commit.

    ``root`` is a directory a crashed run left: at least one committed checkpoint and an
    unfinished ``.tmp`` save newer than it (the check refuses a directory that tests nothing).
    Returns ``(passed, message)`` for :func:`course_lib.check_true`; the message names the
    directory the learner picked and why it is wrong, never the right one.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself (latest_committed, no parentheses), "
                        f"got {type(fn).__name__}")
    positive_int(world, "world")
    root = Path(root)
    expected = latest_committed(root)
    unfinished = [p for p in root.glob("step_*.tmp")
                  if expected is not None and p.name[5:-4].isdigit()
                  and int(p.name[5:-4]) > int(expected.name[5:])]
    if expected is None or not unfinished:
        raise ValueError(f"{root.name} is not a crashed run's directory: it needs a committed "
                         "checkpoint and a newer unfinished .tmp save")
    with tempfile.TemporaryDirectory(prefix="ch6_check_") as scratch:
        copy = Path(scratch) / "ckpt"
        shutil.copytree(root, copy)
        results = run(_resume_rank, world, fn, str(copy), str(copy / expected.name), config,
                      threads=1)
        picks = {r["picked"] for r in results}
        if len(picks) > 1:
            return False, "the ranks picked different directories: each rank must decide the same."
        picked, = picks
        if picked is None:
            return False, ("your function found no checkpoint, but committed ones exist: the "
                           "restart would redo every step from 0.")
        path, name = Path(picked), _name(picked, copy)
        if not path.is_dir() or path.parent != copy:
            return False, f"{name!r} is not a checkpoint directory inside root."
        if not (path / MARKER).is_file():
            return False, (f"you picked {name}, which has no commit marker: its save was "
                           "interrupted, so some shards may be missing. Loading must refuse it.")
        if not all(r.get("loaded") for r in results):
            return False, (f"you picked {name}, which is committed, but a newer committed "
                           "checkpoint exists: the restart would redo steps for nothing.")
    return True, (f"every one of the {world} ranks picked the newest committed checkpoint, "
                  "skipped the unfinished save and loaded its shards.")


def check_restart_pick(answer, root) -> Feedback:
    """Exercise 1: the directory a restart resumes from, after a crash during a save in ``root``."""
    options = ["step_000002", "step_000004", "step_000006.tmp", "none"]
    picked = latest_committed(root)
    return check_choice(answer, picked.name if picked else "none", options,
                        name="latest after a crash during save",
                        hint="a directory counts only with a valid commit marker and a committed name.")


def check_young_daly(answer) -> Feedback:
    """Exercise 3: minutes between checkpoints for C = 120 s and a failure every 4 hours."""
    return check_number(answer, young_daly_interval(120, 4 * 3600) / 60, rtol=0.02,
                        name="Young/Daly interval", unit="min",
                        hint="use the rule of this section, with C and M in the same unit; then convert.")


def check_mtbf_at_scale(answer) -> Feedback:
    """Exercise 4: hours between failures on 100,000 GPUs at 0.173 failures per GPU-year."""
    return check_number(answer, job_mtbf(100_000, 0.173 / (365 * 24 * 3600)) / 3600, rtol=0.02,
                        name="MTBF at 100k GPUs", unit="h",
                        hint="each GPU fails independently: how does the job's failure rate grow with N?")
