"""How often to checkpoint: expected lost work, the Young/Daly interval, and a failure simulator.

Chapter 6. Saving every ``τ`` seconds of work costs ``C`` seconds per save; a failure (mean time
between failures ``M`` of the *whole job*) loses on average half an interval plus a restart of
``R`` seconds. To first order (``C, τ ≪ M``) the fraction of time lost is
``waste(τ) = C/τ + (τ/2 + R)/M``, minimised at Young's interval ``τ* = √(2·C·M)`` (Young 1974;
Daly 2006 adds higher-order terms). A job's MTBF shrinks with its size: ``M = 1 / (N·λ)`` for
``N`` GPUs failing independently at rate ``λ`` each. :data:`LLAMA3` holds Llama 3's failure
figures (Dubey et al. 2024, §3.3.4: 419 interruptions in 54 days on 16,384 GPUs);
:func:`simulate_waste` measures the waste of a simulated job (random failures, real bookkeeping
of what is lost) to compare with the formula.
"""
from __future__ import annotations

import math
import random

__all__ = ["LLAMA3", "per_gpu_failure_rate", "job_mtbf", "young_daly_interval", "expected_waste",
           "simulate_waste", "interval_summary"]

HOUR, DAY, YEAR = 3600.0, 86400.0, 365.0 * 86400.0

#: Llama 3 pre-training, 54-day snapshot (Dubey et al. 2024, Table 5 and §3.3.4).
LLAMA3 = {"interruptions": 419, "days": 54, "gpus": 16384, "effective_time": 0.90}


def _positive(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                or math.isinf(value):
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def per_gpu_failure_rate(interruptions: int = LLAMA3["interruptions"], days: float = LLAMA3["days"],
                         gpus: int = LLAMA3["gpus"]) -> float:
    """Failures per GPU per second: ``interruptions / (days · gpus)`` (Llama 3 by default)."""
    _positive(interruptions=interruptions, days=days, gpus=gpus)
    return interruptions / (days * DAY * gpus)


def job_mtbf(n_gpus: int, rate_per_gpu_s: float) -> float:
    """Mean seconds between failures of a job on ``n_gpus`` GPUs that fail independently."""
    _positive(n_gpus=n_gpus, rate_per_gpu_s=rate_per_gpu_s)
    return 1.0 / (n_gpus * rate_per_gpu_s)


def young_daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Young/Daly optimal seconds of work between checkpoints: ``√(2·C·M)``."""
    _positive(cost_s=cost_s, mtbf_s=mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s)


def expected_waste(interval_s: float, cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """First-order fraction of wall-clock time lost: ``C/τ + (τ/2 + R)/M``."""
    _positive(interval_s=interval_s, cost_s=cost_s, mtbf_s=mtbf_s)
    if restart_s < 0:
        raise ValueError(f"restart_s must be >= 0, got {restart_s!r}")
    return cost_s / interval_s + (interval_s / 2.0 + restart_s) / mtbf_s


def simulate_waste(interval_s: float, cost_s: float, mtbf_s: float, restart_s: float = 0.0, *,
                   work_s: float | None = None, seed: int = 0) -> float:
    """Simulate a job doing ``work_s`` seconds of useful work; return the lost-time fraction.

    The job works ``interval_s``, saves for ``cost_s``, and repeats. Failures arrive at random
    (exponential gaps, mean ``mtbf_s``) at any moment, saves and restarts included; each one
    sends the job back to its last *completed* checkpoint after ``restart_s``. The result is
    ``1 - work / wall-clock`` as counted, not computed from the formula.
    """
    _positive(interval_s=interval_s, cost_s=cost_s, mtbf_s=mtbf_s)
    work_s = work_s if work_s is not None else 2000 * mtbf_s
    rng = random.Random(seed)
    clock, done = 0.0, 0.0
    next_failure = rng.expovariate(1.0 / mtbf_s)
    while done < work_s:
        segment = min(interval_s, work_s - done) + cost_s  # work, then save it
        if clock + segment <= next_failure:
            clock += segment
            done += segment - cost_s
            continue
        clock = next_failure  # the segment is lost; restart from the last checkpoint
        while True:
            next_failure = clock + rng.expovariate(1.0 / mtbf_s)
            if clock + restart_s <= next_failure:
                clock += restart_s
                break
            clock = next_failure  # failed again during the restart: start it over
    return 1.0 - work_s / clock


def interval_summary(n_gpus: int = LLAMA3["gpus"], failures_per_gpu_year: float | None = None,
                     cost_s: float = 30.0, restart_s: float = 120.0) -> dict:
    """Job MTBF, Young/Daly interval, its expected waste and effective-time fraction.

    ``failures_per_gpu_year`` defaults to Llama 3's observed rate (about 0.17 per GPU-year).
    """
    if failures_per_gpu_year is None:
        failures_per_gpu_year = per_gpu_failure_rate() * YEAR
    _positive(failures_per_gpu_year=failures_per_gpu_year)
    mtbf = job_mtbf(n_gpus, failures_per_gpu_year / YEAR)
    tau = young_daly_interval(cost_s, mtbf)
    waste = expected_waste(tau, cost_s, mtbf, restart_s)
    return {"mtbf_s": mtbf, "interval_s": tau, "waste": waste, "effective": 1.0 - waste,
            "failures_per_day": DAY / mtbf}
