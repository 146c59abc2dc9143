"""pytest plugin: with ``COURSE_CLOCK_UNDER_LOAD=N``, the ``clock`` tests run while N busy loops
occupy the cores (CI: N = 2); every other test runs without them.

The ``clock`` tests (tests/conftest.py: deadlines, kills at a moment, races, the grader's time
limits) must hold on a busy machine, so CI runs them that way, once, inside the README's command.
The loops start before a clock test's setup (its module fixtures included) and stop before the
next test that is not one. They are not children of this process (tests check that no child is
left behind), and each exits by itself when this process is gone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

ENV = "COURSE_CLOCK_UNDER_LOAD"
# Spins, and every ~10^6 iterations checks that the test process is still alive.
_LOOP = ("import os, sys\nowner = int(sys.argv[1])\nwhile True:\n"
         "    for _ in range(1_000_000):\n        pass\n    os.kill(owner, 0)\n")


class UnderLoad:
    def __init__(self, loops: int) -> None:
        self.loops, self.pids, self.count, self.load_seen = loops, [], 0, []

    def _start(self) -> None:
        # sh starts the loops in the background and exits: they are reparented away from us
        script = " ".join(f'"$0" -c "$1" {os.getpid()} </dev/null >/dev/null 2>&1 & echo $!;'
                          for _ in range(self.loops))
        out = subprocess.run(["sh", "-c", script, sys.executable, _LOOP], capture_output=True,
                             text=True, check=True).stdout
        self.pids = [int(p) for p in out.split()]

    def _stop(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pids = []

    @pytest.hookimpl(tryfirst=True)   # before the test's fixtures are set up
    def pytest_runtest_setup(self, item) -> None:
        if item.get_closest_marker("clock"):
            self.count += 1
            if not self.pids:
                self._start()
                self.load_seen.append(os.getloadavg()[0])
        elif self.pids:
            self._stop()

    def pytest_sessionfinish(self) -> None:
        self._stop()

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.count:
            seen = ", ".join(f"{x:.1f}" for x in self.load_seen)
            terminalreporter.section("clock tests under load")
            terminalreporter.write_line(f"{self.count} clock tests ran under {self.loops} busy "
                                        f"loops (1-minute load when each group began: {seen})")


def pytest_configure(config) -> None:
    loops = os.environ.get(ENV, "")
    if loops:
        if not loops.isdigit() or int(loops) < 1:
            raise SystemExit(f"{ENV}={loops!r}: give the number of busy loops, e.g. 2")
        config.pluginmanager.register(UnderLoad(int(loops)), "course-clock-under-load")
