"""One usable core, as a one-CPU Binder pod or classroom server grants a learner (issue 36).

:func:`enter` limits this process (and what it starts afterwards) to the first core of its
affinity mask and, where it may make one (root, the cpu controller), to a cgroup whose CPU quota
is one CPU (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``); it says which of the two it got and returns
how to undo it. ``python -m tests.one_core CMD...`` runs a command that way. As a pytest plugin,
``COURSE_NOTEBOOK_CORES=1`` runs the notebooks under nbval that way (their kernels inherit it) and
every other test as before: CI runs the notebooks once on one core, inside the README's command.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from course_lib.common.machine import own_cgroups   # the parser usable_cores() reads

ENV = "COURSE_NOTEBOOK_CORES"
ROOT = Path("/sys/fs/cgroup")


def _make_group(name: str) -> tuple[Path, Path] | None:
    """A new one-CPU cgroup and the group this process is in now, or None where none can be made."""
    if os.geteuid() != 0:
        return None
    v2, v1 = ROOT / "cgroup.controllers", ROOT / "cpu"
    try:
        if v2.is_file() and "cpu" in v2.read_text().split():
            own_path = own_cgroups("/proc/self/cgroup").get("", "/")
            group, own = ROOT / name, ROOT / own_path.lstrip("/")
            group.mkdir()
            (group / "cpu.max").write_text("100000 100000")
        elif (v1 / "cpu.cfs_quota_us").is_file():
            own_path = own_cgroups("/proc/self/cgroup").get("cpu", "/")
            group, own = v1 / name, v1 / own_path.lstrip("/")
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("100000")
        else:
            return None
    except OSError:
        try:
            group.rmdir()
        except (OSError, UnboundLocalError):
            pass
        return None
    return group, own


def enter(name: str = f"course_one_core_{os.getpid()}") -> tuple[Callable[[], None], str]:
    """Put this process on one core; returns ``(undo, what it got)``."""
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    made = _make_group(name)
    if made:
        try:
            (made[0] / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            made[0].rmdir()
            made = None
    what = (f"core {min(mask)} and a 1-CPU cgroup quota ({made[0]})" if made
            else f"core {min(mask)} only (no cgroup could be made here)")

    def undo() -> None:
        os.sched_setaffinity(0, mask)
        if made:
            (made[1] / "cgroup.procs").write_text(str(os.getpid()))
            for _ in range(50):          # the last child may still be leaving the group
                try:
                    made[0].rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
    return undo, what


class NotebooksOnOneCore:
    def __init__(self) -> None:
        self.undo, self.what, self.count = None, "", 0

    @pytest.hookimpl(tryfirst=True)   # before nbval's setup starts the notebook's kernel
    def pytest_runtest_setup(self, item) -> None:
        if str(item.path).endswith(".ipynb"):
            self.count += 1
            if self.undo is None:
                self.undo, self.what = enter()
        elif self.undo is not None:
            self.undo()
            self.undo = None

    def pytest_sessionfinish(self) -> None:
        if self.undo is not None:
            self.undo()
            self.undo = None

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.count:
            terminalreporter.section("notebooks on one core")
            terminalreporter.write_line(f"{self.count} notebook items ran on {self.what}")


def pytest_configure(config) -> None:
    cores = os.environ.get(ENV, "")
    if cores:
        if cores != "1":
            raise SystemExit(f"{ENV}={cores!r}: only 1 is supported (one usable core)")
        config.pluginmanager.register(NotebooksOnOneCore(), "course-notebooks-one-core")


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: python -m tests.one_core COMMAND [ARG...]")
    undo, what = enter()
    print(f"one core: {what}", flush=True)
    start = time.monotonic()
    try:
        status = subprocess.call(argv)
    finally:
        undo()
    print(f"one-core run: {time.monotonic() - start:.0f} s, exit status {status}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
