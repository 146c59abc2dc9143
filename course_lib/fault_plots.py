"""Chapter 6's figures: checkpoint cost against size, lost time against checkpoint interval.

Each function takes measured rows or plain numbers and returns a matplotlib figure sized for a
light notebook (7 x 3.5 inches at 80 dpi).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from course_lib.checkpoint_interval import expected_waste, simulate_waste, young_daly_interval

__all__ = ["plot_checkpoint_cost", "plot_waste"]

_SIZE = dict(figsize=(7, 3.5), dpi=80)


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
