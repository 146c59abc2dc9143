"""pytest plugin: seconds per notebook under nbval, printed at the end of the session.

Register with ``-p tests.nbval_times`` (pyproject ``addopts``). ``--durations`` lists the slowest
cells; this sums setup (the kernel start), call and teardown of every item of a notebook, so a
run on a 2-core machine at load <= 2 reads against the budget (the whole course <= 6 min) in one
table.
"""
from __future__ import annotations

import os


class _Times:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        path = report.nodeid.split("::", 1)[0]
        if path.endswith(".ipynb"):
            self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        terminalreporter.section(f"nbval seconds per notebook (load average {load})")
        for path, total in sorted(self.seconds.items()):
            terminalreporter.write_line(f"{total:7.1f} s  {path}")
        terminalreporter.write_line(f"{sum(self.seconds.values()):7.1f} s  "
                                    f"all {len(self.seconds)} notebooks")


def pytest_configure(config) -> None:
    config.pluginmanager.register(_Times(), "course-nbval-times")
