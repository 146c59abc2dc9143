"""Two cheap per-step health signals of a data-parallel run: a NaN on one rank, a slow rank.

* ``all_finite``: one all-reduce (MIN) of an is-finite flag: every rank learns whether *any*
  rank's loss or gradients went non-finite, and all of them skip the step together;
  ``nonfinite_ranks`` all-gathers the flags to name which rank it was.
* ``step_times`` all-gathers each rank's measured step time; ``stragglers`` names the ranks
  slower than ``factor`` times the median (a synchronous step waits for the slowest rank).
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

__all__ = ["is_finite", "all_finite", "nonfinite_ranks", "step_times", "stragglers"]


def is_finite(*tensors: torch.Tensor) -> bool:
    """True if every element of every tensor (``None`` skipped) is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors if t is not None)


def all_finite(*tensors: torch.Tensor) -> bool:
    """True on every rank if every rank's tensors are finite (one all-reduce of a flag)."""
    flag = torch.tensor([1 if is_finite(*tensors) else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def nonfinite_ranks(*tensors: torch.Tensor) -> list[int]:
    """The ranks whose tensors hold a NaN or an infinity (an all-gather of the flags)."""
    flags = [torch.zeros(1, dtype=torch.int32) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, torch.tensor([1 if is_finite(*tensors) else 0], dtype=torch.int32))
    return [r for r, f in enumerate(flags) if not f.item()]


def step_times(seconds: float) -> list[float]:
    """Every rank's ``seconds``, in rank order, on every rank."""
    times = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(times, torch.tensor([float(seconds)], dtype=torch.float64))
    return [t.item() for t in times]


def stragglers(times: list[float], factor: float = 1.5) -> list[int]:
    """Ranks whose time exceeds ``factor`` × the median of ``times``."""
    median = statistics.median(times)
    return [r for r, t in enumerate(times) if t > factor * median]
