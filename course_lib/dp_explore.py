"""Memory and a playground for data parallelism (chapter 2, ``02_data_parallel``).

* :func:`memory_vs_world` measures per-rank memory under DDP at several world sizes with
  chapter 3's :func:`course_lib.distributed_memory.measure_distributed` (``strategy="ddp"``):
  every rank holds the *full* replica — params, grads and Adam states, 16 B/param in fp32 —
  whatever the number of ranks. Data parallelism adds compute, never room: the model must fit
  on one device.
* :func:`bucket_overhead` measures what DDP adds on top: its gradient buckets (``4Ψ`` more
  unless ``gradient_as_bucket_view=True``), with chapter 1's tracker inside real ranks
  (:func:`course_lib.ddp_internals.measure_dp`).
* :func:`fits_per_world` answers "does it fit?" for a per-device memory budget from measured
  per-rank bytes — under DDP the answer does not change with the world size; sharding
  (chapter 3) is what changes it.
* :func:`dp_explorer` / :func:`dp_widget`: world size (1-8 "GPUs"), model size and local batch
  → a real run, plotted (per-rank memory, step time, bytes sent).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from course_lib.ddp_internals import DPStepReport, expected_bytes, measure_dp
from course_lib.launch import run
from course_lib.memory_report import format_bytes
from course_lib.models import get_config

__all__ = ["memory_vs_world", "format_memory_vs_world", "bucket_overhead", "fits_per_world",
           "format_fits", "WIDGET_PRESETS", "dp_explorer", "show_dp_explorer", "dp_widget"]

WIDGET_PRESETS = ("tiny", "small", "medium")


def memory_vs_world(preset: str = "small", batch: tuple[int, int] = (4, 32),
                    worlds: Sequence[int] = (1, 2, 4)) -> dict[int, dict[str, int]]:
    """Per-rank bytes (rank 0's report; all ranks agree) of a DDP step at each world size.

    Keys per world: ``params``, ``grads``, ``optimizer``, ``model_states`` and ``peak``, plus
    ``max_rank_model_states`` (the largest over ranks). Each rank runs chapter 3's
    ``measure_rank`` (what ``measure_distributed(strategy="ddp")`` runs), here with one thread
    per rank: the CPU analogue of one GPU each, and no idle threads spinning on a busy machine.
    """
    from course_lib.distributed_memory import check_request, measure_rank  # chapter 3's instrument

    out = {}
    for world in worlds:
        check_request(preset, batch, "ddp", world, "adam", "fp32")
        reports = run(measure_rank, world, preset, batch, strategy="ddp", threads=1)
        row = {k: reports[0][k] for k in ("params", "grads", "optimizer", "model_states", "peak")}
        row["max_rank_model_states"] = max(r["model_states"] for r in reports)
        row["n_params"] = reports[0].n_params
        out[world] = row
    return out


def format_memory_vs_world(per_world: Mapping[int, Mapping[str, int]]) -> str:
    """A table of :func:`memory_vs_world`: bytes and bytes per parameter per rank."""
    lines = [f"{'ranks':>5}{'params':>12}{'grads':>12}{'optimizer':>12}{'model states':>14}"
             f"{'B/param':>9}"]
    for world, row in sorted(per_world.items()):
        lines.append(f"{world:>5}{format_bytes(row['params']):>12}{format_bytes(row['grads']):>12}"
                     f"{format_bytes(row['optimizer']):>12}"
                     f"{format_bytes(row['model_states']):>14}"
                     f"{row['model_states'] / row['n_params']:>9.2f}")
    return "\n".join(lines)


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


def format_fits(per_rank_bytes: Mapping[int, int], budget_bytes: int) -> str:
    """One line per world size: measured bytes per rank, the budget, fits or not."""
    fits = fits_per_world(per_rank_bytes, budget_bytes)
    return "\n".join(f"{world} rank(s): {format_bytes(per_rank_bytes[world])} per rank vs "
                     f"{format_bytes(budget_bytes)} per device -> "
                     f"{'fits' if ok else 'does NOT fit'}" for world, ok in fits.items())


def dp_explorer(world: int = 2, preset: str = "tiny", local_batch: int = 4,
                seq_len: int = 32) -> tuple[list[DPStepReport], dict[str, float]]:
    """One real DDP run: the per-rank reports and the formulas to compare them with."""
    if preset not in WIDGET_PRESETS:
        raise ValueError(f"preset must be one of {WIDGET_PRESETS} here (the rest do not fit "
                         f"a laptop), got {preset!r}")
    reports = measure_dp(world, preset, local_batch, seq_len, timed_steps=2)
    return reports, expected_bytes(reports[0].n_params, world)


def show_dp_explorer(world: int = 2, preset: str = "tiny", local_batch: int = 4,
                     gpu_memory_mib: float = 0.0) -> None:
    """Print and plot :func:`dp_explorer`; ``gpu_memory_mib`` > 0 draws a per-device budget."""
    import matplotlib.pyplot as plt

    from course_lib.dp_plots import plot_dp_run

    try:
        seq_len = min(32, get_config(preset).seq_len)
        reports, expected = dp_explorer(world, preset, local_batch, seq_len)
    except ValueError as err:
        print(f"ValueError: {err}")
        return
    r = reports[0]
    budget = gpu_memory_mib * 2**20 if gpu_memory_mib else None
    print(f"{world} rank(s) × local batch {local_batch} = global batch {world * local_batch}; "
          f"{r.n_params:,} parameters on every rank")
    sent = "n/a" if r.sent_bytes is None else format_bytes(r.sent_bytes)
    print(f"rank 0: peak {format_bytes(r.peak)}, step {r.step_ms:.0f} ms, sent {sent} per step "
          f"(ring formula {format_bytes(expected['ring_sent_per_rank'])})")
    if budget:
        verdict = "fits" if r.peak <= budget else "does NOT fit — more ranks will not help"
        print(f"budget {format_bytes(budget)} per device: {verdict}")
    plot_dp_run(reports, expected["ring_sent_per_rank"], budget)
    plt.show()


def dp_widget():
    """Sliders over :func:`show_dp_explorer`; each change is a real run (about a second)."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    return w.interactive(
        show_dp_explorer,
        world=w.IntSlider(value=2, min=1, max=8, description="GPUs (ranks)", style=style,
                          continuous_update=False),
        preset=w.Dropdown(options=list(WIDGET_PRESETS), value="tiny", description="model",
                          style=style),
        local_batch=w.Dropdown(options=[1, 2, 4, 8, 16], value=4, style=style),
        gpu_memory_mib=w.FloatText(value=0.0, description="GPU memory (MiB, 0 = none)",
                                   style=style, continuous_update=False),
    )
