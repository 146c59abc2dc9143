"""See how the ranks of :func:`course_lib.run` ended — for the clean-exit test and benchmark.

Background (chapter 3, ``shared/pytorch-cpu-facts.md``): a gloo rank that finishes its work and
then lets the Python interpreter shut down aborts in 10-30 % of runs ("terminate called without
an active exception", SIGABRT) — a gloo thread grabs the GIL during finalisation. The launcher
therefore ends each rank with ``os._exit`` right after handing its result over.

``run`` itself does not return exit statuses: once every rank has answered it kills whatever
has not exited yet. :func:`recorded_exit_codes` patches two private helpers of
:mod:`course_lib.launch` *for the duration of a with-block* so that ranks which answered may end
on their own and their exit statuses are recorded (``0`` = clean, ``-6`` = SIGABRT, ``None`` =
did not end within the launcher's 5-second drain).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from course_lib import launch

__all__ = ["recorded_exit_codes"]


@contextmanager
def recorded_exit_codes() -> Iterator[list[list[int | None]]]:
    """Within the block, every ``run`` appends its ranks' exit statuses to the yielded list."""
    codes: list[list[int | None]] = []
    original_kill, original_drain = launch._Rank.kill, launch._drain

    def kill(state: launch._Rank) -> None:
        if state.outcome is None:  # only ranks that never answered are killed
            original_kill(state)

    def drain(ranks, sel, deadline: float) -> None:
        original_drain(ranks, sel, deadline)
        codes.append([state.exitcode for state in ranks])

    launch._Rank.kill, launch._drain = kill, drain
    try:
        yield codes
    finally:
        launch._Rank.kill, launch._drain = original_kill, original_drain


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
