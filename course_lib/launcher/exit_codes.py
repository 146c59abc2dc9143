"""Deprecated (issue 51): instruments, not the launcher — ``fsdp_step`` and ``ddp_step`` live in
``benchmarks/bench_clean_exit.py``; a rank's exit status is ``run(..., report=RunReport())``'s
``report.exit_statuses``.

Each old name is served with a ``DeprecationWarning`` for one release (the two steps are loaded
from the benchmark file of a source checkout).
"""
from __future__ import annotations

from typing import Any, Callable

from course_lib.common.deprecation import moved_to_benchmark, warn_renamed
from course_lib.launcher.launch import RunReport, run


def exit_statuses(fn: Callable[..., Any], nprocs: int, *args: Any, **kwargs: Any) -> list:
    """Deprecated: the ranks' exit statuses of ``run(fn, nprocs, ...)``, in rank order."""
    warn_renamed("course_lib.launcher.exit_codes.exit_statuses",
                 "run(..., report=RunReport()) and report.exit_statuses")
    report = RunReport()
    run(fn, nprocs, *args, report=report, **kwargs)
    return report.exit_statuses


__getattr__ = moved_to_benchmark(__name__, ("fsdp_step", "ddp_step"), "bench_clean_exit.py")
