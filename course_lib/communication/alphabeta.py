"""Measure ring all-reduces and fit chapter 5's α-β model to them.

The formulas (``T(n, p) = 2(p-1)·α + 2(p-1)/p · n·β``, the relative least-squares fit, its
tolerance) live in :mod:`course_lib.communication.formulas`, which imports no launcher; this
module adds :func:`measure_all_reduce` (real ranks) and hands the formulas on under their
chapter-5 import path.
"""
from __future__ import annotations

from typing import Sequence

from course_lib.communication.benchmark import CollectiveResult, benchmark_collectives, power_sizes
from course_lib.communication.formulas import (FIT_TOLERANCE, AlphaBeta, fit_alpha_beta,
                                               fit_errors, fit_per_world, points_of,
                                               ring_allreduce_time, within_tolerance)

__all__ = ["AlphaBeta", "ring_allreduce_time", "fit_alpha_beta", "fit_per_world",
           "measure_all_reduce", "fit_errors", "within_tolerance", "points_of", "FIT_TOLERANCE"]


def measure_all_reduce(worlds: Sequence[int] = (2, 4),
                       sizes: Sequence[int] = tuple(power_sizes(2**12, 2**24, 4)),
                       repeats: int = 3) -> list[CollectiveResult]:
    """All-reduce times for each world size and size: the median of ``repeats`` runs per point."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out = []
    for world in worlds:
        runs = [benchmark_collectives(["all_reduce"], sizes, world) for _ in range(repeats)]
        for same in zip(*runs):
            middle = sorted(same, key=lambda row: row.seconds)[len(same) // 2]
            out.append(middle)
    return out
