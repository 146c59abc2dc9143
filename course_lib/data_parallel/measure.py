"""Chapter 2's measurements: what DDP adds, whether a model fits, one explorer run.

Per-rank memory against the world size (:func:`course_lib.sharding.measure.memory_vs_world`)
uses chapter 3's instrument and lives there.

* :func:`bucket_overhead` measures what DDP adds on top: its gradient buckets (``4Ψ`` more
  unless ``gradient_as_bucket_view=True``), with chapter 1's tracker inside real ranks
  (:func:`course_lib.data_parallel.ddp_internals.measure_dp`).
* :func:`fits_per_world` answers "does it fit?" for a per-device memory budget from measured
  per-rank bytes — under DDP the answer does not change with the world size; sharding
  (chapter 3) is what changes it.
* :func:`dp_explorer`: world size (1-8 "GPUs"), model size and local batch → a real run and
  the formulas to compare it with (drawn by :mod:`course_lib.data_parallel.show`).
"""
from __future__ import annotations

from typing import Mapping

from course_lib.data_parallel.ddp_internals import DPStepReport, expected_bytes, measure_dp

__all__ = ["bucket_overhead", "fits_per_world", "WIDGET_PRESETS", "dp_explorer"]

WIDGET_PRESETS = ("tiny", "small", "medium")


def bucket_overhead(preset: str = "small", world: int = 2) -> dict[str, dict[str, float]]:
    """Everything alive after the optimizer step, with and without ``gradient_as_bucket_view``.

    Returns ``{"buckets beside grads": {...}, "grads as bucket views": {...}}`` with
    ``alive_bytes``, ``bytes_per_param`` and ``peak`` (tracker, rank 0).
    """
    out = {}
    for label, view in (("buckets beside grads", False), ("grads as bucket views", True)):
        r = measure_dp(world, preset, gradient_as_bucket_view=view, timed_steps=1)[0]
        out[label] = {"alive_bytes": r.alive_after_step,
                      "bytes_per_param": r.alive_after_step / r.n_params, "peak": r.peak}
    return out


def fits_per_world(per_rank_bytes: Mapping[int, int], budget_bytes: int) -> dict[int, bool]:
    """For each world size, does the measured per-rank memory fit the per-device budget?"""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) \
            or budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be a positive number of bytes, got {budget_bytes!r}")
    if not per_rank_bytes:
        raise ValueError("per_rank_bytes is empty: pass {world size: measured bytes per rank}")
    return {world: nbytes <= budget_bytes for world, nbytes in sorted(per_rank_bytes.items())}


def dp_explorer(world: int = 2, preset: str = "tiny", local_batch: int = 4,
                seq_len: int = 32) -> tuple[list[DPStepReport], dict[str, float]]:
    """One real DDP run: the per-rank reports and the formulas to compare them with."""
    if preset not in WIDGET_PRESETS:
        raise ValueError(f"preset must be one of {WIDGET_PRESETS} here (the rest do not fit "
                         f"a laptop), got {preset!r}")
    reports = measure_dp(world, preset, local_batch, seq_len, timed_steps=2)
    return reports, expected_bytes(reports[0].n_params, world)
