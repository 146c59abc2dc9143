"""Chapter 6's figures and widget: checkpoint cost against size, lost time against interval.

Figures take measured rows or plain numbers; :func:`show_interval` prints
:func:`course_lib.fault_tolerance.interval.interval_summary` and draws :func:`plot_waste`;
:func:`interval_widget` puts inputs in front of it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from course_lib.display import DPI, FIGSIZE

from course_lib.fault_tolerance.interval import (expected_waste, interval_summary, simulate_waste,
                                                 young_daly_interval)

__all__ = ["plot_checkpoint_cost", "plot_waste", "format_interval", "show_interval",
           "interval_widget"]


_SIZE = dict(figsize=FIGSIZE, dpi=DPI)


def _secs(seconds: float) -> str:
    """A slider's seconds for a title: "50 s", "2.5 s" (a log slider gives 50.1187...)."""
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


def plot_checkpoint_cost(rows: Sequence[Mapping]) -> Figure:
    """Measured save and load milliseconds against checkpoint megabytes (one dot per model)."""
    fig, ax = plt.subplots(**_SIZE)
    mb = [r["bytes"] / 1e6 for r in rows]
    ax.plot(mb, [r["save_s"] * 1e3 for r in rows], "o-", label="save (2 ranks, DCP + manifest)")
    ax.plot(mb, [r["load_s"] * 1e3 for r in rows], "s-", label="load (verify checksums + DCP)")
    ax.set(xscale="log", yscale="log", xlabel="checkpoint size (MB on disk)", ylabel="ms",
           title="Checkpoint cost on this machine")
    ax.set_xticks(mb, [f"{m:.3g}\n{r['model']}" for m, r in zip(mb, rows)])  # one label per dot
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_waste(cost_s: float, mtbf_s: float, restart_s: float = 0.0, simulate: bool = True,
               seed: int = 0) -> Figure:
    """Lost-time fraction against interval: first-order formula (line), simulated job (dots)."""
    best = young_daly_interval(cost_s, mtbf_s)
    taus = [best * 2 ** (k / 4) for k in range(-16, 13)]
    fig, ax = plt.subplots(**_SIZE)
    ax.plot([t / 60 for t in taus], [100 * expected_waste(t, cost_s, mtbf_s, restart_s) for t in taus],
            label="C/τ + (τ/2 + R)/M")
    if simulate:
        pts = taus[::4]
        sims = [100 * simulate_waste(t, cost_s, mtbf_s, restart_s, work_s=300 * mtbf_s, seed=seed)
                for t in pts]
        ax.plot([t / 60 for t in pts], sims, "o", label="simulated job (random failures)")
    ax.axvline(best / 60, color="grey", ls="--", label=f"√(2CM) = {best / 60:.1f} min")
    ax.set(xscale="log", xlabel="checkpoint interval τ (minutes of work)", ylabel="time lost (%)",
           title=f"C = {_secs(cost_s)}, M = {mtbf_s / 3600:.2f} h, R = {_secs(restart_s)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def format_interval(n_gpus: int, failures_per_gpu_year: float, cost_s: float,
                    restart_s: float) -> str:
    """One paragraph: job MTBF, failures per day, Young/Daly interval, expected time lost."""
    s = interval_summary(n_gpus, failures_per_gpu_year, cost_s, restart_s)
    return (f"{n_gpus:,} GPUs at {failures_per_gpu_year:.3g} failures per GPU-year: a failure every "
            f"{s['mtbf_s'] / 3600:.2f} h ({s['failures_per_day']:.1f} per day)\n"
            f"checkpoint every √(2·C·M) = {s['interval_s'] / 60:.1f} min of work → "
            f"{100 * s['waste']:.1f} % of the time lost, {100 * s['effective']:.1f} % effective")


def show_interval(n_gpus: int = 16384, failures_per_gpu_year: float = 0.173,
                  cost_s: float = 30.0, restart_s: float = 120.0) -> None:
    """Print :func:`format_interval` and draw the lost-time curve (no simulation: instant)."""
    import matplotlib.pyplot as plt

    try:
        print(format_interval(n_gpus, failures_per_gpu_year, cost_s, restart_s))
    except ValueError as err:
        print(f"ValueError: {err}")
        return
    s = interval_summary(n_gpus, failures_per_gpu_year, cost_s, restart_s)
    plot_waste(cost_s, s["mtbf_s"], restart_s, simulate=False)
    plt.show()


def interval_widget():
    """Inputs for cluster size, per-GPU failure rate, checkpoint and restart cost."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    return w.interactive(
        show_interval,
        n_gpus=w.IntText(value=16384, description="GPUs", style=style),
        failures_per_gpu_year=w.FloatLogSlider(value=0.173, base=10, min=-3, max=1, step=0.05,
                                               description="failures per GPU-year", style=style),
        cost_s=w.FloatLogSlider(value=30, base=10, min=0, max=3.5, step=0.05,
                                description="checkpoint cost C (s)", style=style),
        restart_s=w.FloatSlider(value=120, min=0, max=1800, step=30,
                                description="restart cost R (s)", style=style),
    )
