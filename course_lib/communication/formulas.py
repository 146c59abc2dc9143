"""The α-β (latency-bandwidth) model of a ring all-reduce and its fit, pure formulas (ch. 5).

One message of ``m`` bytes costs ``α + m·β``: a fixed latency ``α`` plus ``β`` seconds per byte.
A ring all-reduce of ``n`` bytes on ``p`` ranks makes ``2(p-1)`` steps of ``n/p`` bytes
(:mod:`course_lib.communication.ring`), so ``T(n, p) = 2(p-1)·α + 2(p-1)/p · n·β`` (Thakur,
Rabenseifner & Gropp, IJHPCA 2005): small messages are latency-bound, large ones bandwidth-bound.
:func:`fit_alpha_beta` fits α and β by least squares on *relative* errors (microsecond and
second-long points weigh the same), both non-negative; :data:`FIT_TOLERANCE` is how close the
fit is held to the measured medians. Where ranks share cores, one (α, β) cannot serve every
world size: fit each separately (:func:`fit_per_world`). Imports no launcher: the measuring
lives in :mod:`course_lib.communication.alphabeta`.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # the measured rows' type; its module starts ranks
    from course_lib.communication.benchmark import CollectiveResult

__all__ = ["AlphaBeta", "ring_allreduce_time", "fit_alpha_beta", "fit_per_world", "fit_errors",
           "within_tolerance", "points_of", "FIT_TOLERANCE"]

#: (worst point, median point): largest allowed |predicted/measured - 1| (worst as factor 2).
FIT_TOLERANCE = (1.0, 0.35)


def ring_allreduce_time(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """``2(p-1)α + 2(p-1)/p · n·β`` seconds: a ring all-reduce of ``n_bytes`` on ``p`` ranks."""
    if p < 1 or n_bytes < 0:
        raise ValueError(f"need p >= 1 and n_bytes >= 0, got p={p}, n_bytes={n_bytes}")
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta


@dataclass(frozen=True)
class AlphaBeta:
    """Latency ``alpha`` (s) and inverse bandwidth ``beta`` (s/byte) of one link."""

    alpha: float
    beta: float

    @property
    def bandwidth_gbps(self) -> float:
        """``1/β`` in GB/s (1e9 bytes/s); infinite when β = 0."""
        return math.inf if self.beta == 0 else 1e-9 / self.beta

    def all_reduce(self, n_bytes: float, p: int) -> float:
        """Predicted seconds for a ring all-reduce of ``n_bytes`` on ``p`` ranks."""
        return ring_allreduce_time(n_bytes, p, self.alpha, self.beta)

    def __str__(self) -> str:
        return f"α = {self.alpha * 1e6:.1f} µs, β = 1/({self.bandwidth_gbps:.3f} GB/s)"


def _solve(rows: list[tuple[float, float]], targets: list[float]) -> tuple[float, float]:
    """Least squares for 2 unknowns via the 2x2 normal equations (plain floats)."""
    s11 = sum(a * a for a, _ in rows)
    s12 = sum(a * b for a, b in rows)
    s22 = sum(b * b for _, b in rows)
    t1 = sum(a * t for (a, _), t in zip(rows, targets))
    t2 = sum(b * t for (_, b), t in zip(rows, targets))
    det = s11 * s22 - s12 * s12
    if det <= 1e-12 * s11 * s22:
        raise ValueError("the points cannot separate α from β: measure several message sizes")
    return (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det


def fit_alpha_beta(points: Sequence[tuple[int, float, float]]) -> AlphaBeta:
    """Fit α, β to ``(p, n_bytes, seconds)`` points of ring all-reduces (any mix of ``p``).

    Minimises the sum of squared *relative* errors ``(T(n, p)/t - 1)²``; if the unconstrained
    optimum has a negative α or β, that parameter is set to 0 and the other refitted.
    """
    pts = [(int(p), float(n), float(t)) for p, n, t in points]
    if len(pts) < 2:
        raise ValueError(f"need at least 2 measured points, got {len(pts)}")
    for p, n, t in pts:
        if p < 2 or n <= 0 or t <= 0:
            raise ValueError(f"each point needs p >= 2, n_bytes > 0, seconds > 0; got {(p, n, t)}")
    # divide each equation a·x1 + b·x2 = t by t: relative errors, target 1
    rows = [(2 * (p - 1) / t, 2 * (p - 1) / p * n / t) for p, n, t in pts]
    ones = [1.0] * len(rows)
    alpha, beta = _solve(rows, ones)
    if alpha < 0 or beta < 0:  # the best non-negative fit then lies on an axis
        only_alpha = sum(a for a, _ in rows) / sum(a * a for a, _ in rows)
        only_beta = sum(b for _, b in rows) / sum(b * b for _, b in rows)
        err_a = sum((a * only_alpha - 1) ** 2 for a, _ in rows)
        err_b = sum((b * only_beta - 1) ** 2 for _, b in rows)
        alpha, beta = (only_alpha, 0.0) if err_a <= err_b else (0.0, only_beta)
    return AlphaBeta(alpha, beta)


def fit_per_world(rows: Sequence[CollectiveResult]) -> dict[int, AlphaBeta]:
    """One :class:`AlphaBeta` per world size found in all-reduce ``rows``."""
    points = points_of(rows)
    return {p: fit_alpha_beta([pt for pt in points if pt[0] == p])
            for p in sorted({pt[0] for pt in points})}


def fit_errors(fit: AlphaBeta, points: Sequence[tuple[int, float, float]]) -> list[float]:
    """``predicted/measured - 1`` for each ``(p, n_bytes, seconds)`` point."""
    return [fit.all_reduce(n, p) / t - 1 for p, n, t in points]


def within_tolerance(errors: Sequence[float], tolerance: tuple[float, float] = FIT_TOLERANCE
                     ) -> bool:
    """True when every point is within a factor ``1 + worst`` and the median within ``median``."""
    worst, median = tolerance
    log_limit = math.log1p(worst)
    return (all(abs(math.log1p(e)) <= log_limit for e in errors)
            and statistics.median(abs(e) for e in errors) <= median)


def points_of(rows: Sequence[CollectiveResult]) -> list[tuple[int, float, float]]:
    """``(p, n_bytes, seconds)`` points from all-reduce rows, ready for :func:`fit_alpha_beta`."""
    return [(row.world, row.size_bytes, row.seconds) for row in rows
            if row.collective == "all_reduce"]
