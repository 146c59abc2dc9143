"""Chapter 6's figures and widget: checkpoint cost against size, lost time against interval, and
the commit protocol as the timeline of the files a run created (:func:`plot_commit_timeline`).
Figures take measured rows or plain numbers."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from course_lib.display import DPI, FIGSIZE, FONT_MIN, GREY, PALETTE, WIDGET_STYLE
from course_lib.fault_tolerance.file_events import classify

from course_lib.fault_tolerance.interval import (expected_waste, interval_summary, simulate_waste,
                                                 young_daly_interval)
from course_lib.common.plots import legible

__all__ = ["plot_checkpoint_cost", "plot_waste", "format_interval", "show_interval",
           "interval_widget", "plot_commit_timeline"]


_SIZE = dict(figsize=FIGSIZE, dpi=DPI)


def _secs(seconds: float) -> str:
    """A slider's seconds for a title: "50 s", "2.5 s" (a log slider gives 50.1187...)."""
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


@legible
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
    ax.legend(fontsize=FONT_MIN)
    fig.tight_layout()
    return fig


@legible
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
    ax.axvline(best / 60, color=GREY, ls="--", label=f"√(2CM) = {best / 60:.1f} min")
    ax.set(xscale="log", xlabel="checkpoint interval τ (minutes of work)", ylabel="time lost (%)",
           title=f"C = {_secs(cost_s)}, M = {mtbf_s / 3600:.2f} h, R = {_secs(restart_s)}")
    ax.legend(fontsize=FONT_MIN)
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

    style = WIDGET_STYLE
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


#: kind -> (matplotlib marker, colour, size)
_EVENT_STYLE = {"tmp dir": ("s", GREY, 60), "shard": ("o", PALETTE[0], 70),
                "metadata": ("D", PALETTE[1], 60), "marker": ("^", PALETTE[2], 90),
                "commit rename": ("*", PALETTE[3], 220), "crash": ("X", PALETTE[5], 200)}


@legible
def plot_commit_timeline(events: Sequence[Mapping]) -> Figure:
    """One panel per save (``step_N``), one row per rank, x = the order of the file operations
    of the commit protocol in time (they can be microseconds apart), as recorded inside the
    ranks by :func:`course_lib.fault_tolerance.file_events.traced_run`; the title gives the
    save's duration; a SIGKILL is drawn in the save its rank was in."""
    import re
    saves: dict[str, list] = {}
    current: dict[int, str] = {}
    for e in events:
        kind = classify(e)
        if kind == "other":
            continue
        found = re.search(r"step_\d+", e["path"])
        save = found[0] if found else current.get(e["rank"])
        if save is None:
            continue
        current[e["rank"]] = save
        saves.setdefault(save, []).append((e, kind))
    ranks = sorted({e["rank"] for e in events}) or [0]
    fig, axes = plt.subplots(1, max(len(saves), 1), figsize=(7.0, 1.9 + 0.35 * len(ranks)),
                             dpi=DPI, sharey=True, squeeze=False)
    seen = set()
    for ax, (save, items) in zip(axes[0], saves.items()):
        for k, (e, kind) in enumerate(items):
            marker, colour, size = _EVENT_STYLE[kind]
            ax.scatter(k + 1, e["rank"], marker=marker, color=colour, s=size,
                       zorder=3, label=None if kind in seen else kind)
            seen.add(kind)
        committed = any(kind == "commit rename" for _, kind in items)
        ms = (items[-1][0]["t"] - items[0][0]["t"]) * 1e3
        ax.set_title(f"{save}, {ms:.0f} ms\n{'committed' if committed else 'NOT committed'}",
                     fontsize=FONT_MIN, color="black" if committed else PALETTE[5])
        ax.set_xlabel("n-th file operation", fontsize=FONT_MIN)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.15)
    axes[0, 0].set_yticks(ranks, [f"rank {r}" for r in ranks], fontsize=FONT_MIN)
    axes[0, 0].set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    handles, labels = zip(*sorted(((h, l) for a in axes[0] for h, l in zip(*a.get_legend_handles_labels())),
                                  key=lambda hl: list(_EVENT_STYLE).index(hl[1])))
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=FONT_MIN, frameon=False)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    return fig
