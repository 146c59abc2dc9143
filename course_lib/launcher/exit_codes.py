"""Deprecated (issue 51): instruments, not the launcher — ``fsdp_step`` and ``ddp_step`` live in
``benchmarks/bench_clean_exit.py``; a rank's exit status is ``run(..., report=RunReport())``'s
``report.exit_statuses``.

Each old name is served with a ``DeprecationWarning`` for one release (the two steps are loaded
from the benchmark file of a source checkout).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

from course_lib.common.deprecation import warn_renamed
from course_lib.launcher.launch import RunReport, run

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_clean_exit.py"


def exit_statuses(fn: Callable[..., Any], nprocs: int, *args: Any, **kwargs: Any) -> list:
    """Deprecated: the ranks' exit statuses of ``run(fn, nprocs, ...)``, in rank order."""
    warn_renamed("course_lib.launcher.exit_codes.exit_statuses",
                 "run(..., report=RunReport()) and report.exit_statuses")
    report = RunReport()
    run(fn, nprocs, *args, report=report, **kwargs)
    return report.exit_statuses


def __getattr__(name: str) -> Any:
    if name not in ("fsdp_step", "ddp_step"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_renamed(f"{__name__}.{name}", f"{name} of benchmarks/bench_clean_exit.py")
    spec = importlib.util.spec_from_file_location("bench_clean_exit", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)
