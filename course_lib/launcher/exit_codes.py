"""See how the ranks of :func:`course_lib.run` ended — for the clean-exit test and benchmark.

Background: a gloo rank that finishes its work and
then lets the Python interpreter shut down aborts in 10-30 % of runs ("terminate called without
an active exception", SIGABRT) — a gloo thread grabs the GIL during finalisation. The launcher
therefore ends each rank with ``os._exit`` once every rank has handed its result over.

``run`` reports exit statuses through its supported hook, ``run(..., report=RunReport())``
(``report.exit_statuses``: ``0`` = clean, ``-6`` = SIGABRT, ``None`` = did not end within the
launcher's 5-second drain); :func:`exit_statuses` is the one-line form.
"""
from __future__ import annotations

from typing import Any, Callable

from course_lib.launcher.launch import RunReport, run

__all__ = ["exit_statuses", "fsdp_step", "ddp_step"]


def exit_statuses(fn: Callable[..., Any], nprocs: int, *args: Any, **kwargs: Any) -> list:
    """Run ``fn`` like :func:`course_lib.run` and return its ranks' exit statuses, in rank order."""
    report = RunReport()
    run(fn, nprocs, *args, report=report, **kwargs)
    return report.exit_statuses


def fsdp_step() -> int:
    """One FSDP2 forward/backward on a toy model (the launch pattern that aborted at exit)."""
    import torch
    from torch.distributed.fsdp import fully_shard
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model(torch.randn(2, 8)).sum().backward()
    return 0


def ddp_step() -> int:
    """One DDP forward/backward on a toy model (the other launch pattern that aborted)."""
    import torch
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    model(torch.randn(2, 8)).sum().backward()
    return 0
