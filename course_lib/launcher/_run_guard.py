"""Two safeguards of :func:`course_lib.run`: Stop held back while ranks start, and run folders.

* :func:`holding_interrupts`: while the launcher sends jobs to the warm server and reads back
  the pids, an interrupt (the notebook's Stop button is a SIGINT) is recorded instead of raised,
  then raised as soon as the block ends, when every started rank is known and can be ended. An
  interrupt in the middle of that exchange once left pids unread, so later runs matched ranks to
  wrong pids and left orphans. A second Stop during the block is not held back: the launcher
  then discards the server (see :meth:`course_lib.launcher._warm.WarmServer.fork`).
* :func:`make_run_dir`: each run's private folder (its FileStore) is named after the launching
  process, so folders left by a killed kernel are removed by the next kernel that starts.
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from typing import Iterator

import psutil

PREFIX = "course_lib_run_"


@contextmanager
def holding_interrupts() -> Iterator[None]:
    """Hold back one SIGINT until the block ends (main thread only: others never get one)."""
    pending: list[int] = []

    def record(signum, frame):
        if pending:  # pressed again: the user means it, now
            raise KeyboardInterrupt
        pending.append(signum)

    try:
        previous = signal.signal(signal.SIGINT, record)
    except ValueError:  # not the main thread of the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            signal.raise_signal(signal.SIGINT)  # handled by the restored handler, as it would be


def make_run_dir() -> str:
    """A private folder for one run, ``course_lib_run_<pid>_*`` (removed by the launcher)."""
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}_")


def sweep_stale_run_dirs() -> int:
    """Remove run folders of launching processes that no longer exist; return how many."""
    removed = 0
    for path in glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "*_*")):
        pid = os.path.basename(path)[len(PREFIX):].split("_", 1)[0]
        try:
            mine = os.stat(path).st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed
