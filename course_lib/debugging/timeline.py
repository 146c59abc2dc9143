"""A straggler on the per-rank timeline (chapter 10): one rank slowed, the others waiting.

The loop of :func:`~course_lib.debugging.measure.straggler_run` (chapter 02's
``average_gradients`` after each rank's forward and backward; one rank sleeps ``delay`` seconds
before communicating, as a throttled core or a busy neighbour would make it late) recorded by
:class:`~course_lib.common.timeline.Timeline`: "compute" spans in the compute lane, every
collective in the comm lane. The fast ranks' first all-reduce of each step lasts as long as the
slow rank is late: waiting looks like communication. The verdict comes from the gathered
compute times (:func:`~course_lib.debugging.health.stragglers`), not from the picture.
"""
from __future__ import annotations

import time

import torch.distributed as dist
from torch import nn

from course_lib.common.checks import positive_int
from course_lib.common.timeline import Timeline
from course_lib.data_parallel.by_hand import average_gradients
from course_lib.debugging.health import step_times, stragglers
from course_lib.debugging.measure import _batch, _rank_model_sgd
from course_lib.launcher.launch import run

__all__ = ["straggler_timeline"]


def _straggler_timeline_rank(slow_rank: int, delay: float, steps: int) -> dict:
    rank, model, opt = _rank_model_sgd()
    tl, computes = Timeline(), []
    dist.barrier()
    with tl:
        for step in range(steps):
            start = time.perf_counter()
            with tl.span("compute"):
                x, y = _batch(step, rank)
                nn.functional.mse_loss(model(x), y).backward()
                if rank == slow_rank:
                    time.sleep(delay)   # the injected slowness
            computes.append(time.perf_counter() - start)
            average_gradients(model)    # the fast ranks wait here for the slow one
            with tl.span("step"):
                opt.step()
                opt.zero_grad()
    gathered = step_times(sum(computes) / len(computes))   # outside the Timeline: not drawn
    return {"spans": tl.events(), "compute_times": gathered}


def straggler_timeline(slow_rank: int = 1, delay: float = 0.05, steps: int = 3,
                       nprocs: int = 2, factor: float = 1.5, timeout: float = 60.0) -> dict:
    """Run the straggler loop; returns ``spans`` (every rank), ``compute_times`` (each rank's
    mean compute per step, gathered on the ranks) and ``stragglers`` (ranks slower than
    ``factor`` × the median)."""
    positive_int(nprocs, "nprocs")
    positive_int(steps, "steps")
    if not 0 <= slow_rank < nprocs:
        raise ValueError(f"slow_rank must be a rank of {nprocs}, got {slow_rank!r}")
    if not 0 <= delay <= 2:
        raise ValueError(f"delay must be between 0 and 2 seconds, got {delay!r}")
    per_rank = run(_straggler_timeline_rank, nprocs, slow_rank, delay, steps, timeout=timeout)
    times = per_rank[0]["compute_times"]
    return {"spans": [s for r in per_rank for s in r["spans"]], "compute_times": times,
            "stragglers": stragglers(times, factor)}
