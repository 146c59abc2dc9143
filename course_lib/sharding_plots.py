"""Figures of chapter 3 (``03_sharding_zero_fsdp``): per-rank bytes, measured next to the formula.

Every function takes measurements (:class:`~course_lib.memory_report.MemoryReport` lists from
:func:`course_lib.distributed_memory.measure_distributed`) and formula rows
(:func:`course_lib.zero.per_rank_bytes`) and returns a matplotlib ``Figure`` (small: the notebook
stores them). Solid bars are measured, hatched bars are the formula.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.plots import COLORS, DPI, FIGSIZE

__all__ = ["PARTS", "plot_ranks", "plot_strategies", "plot_comm"]

#: What the bars stack, bottom to top, with colours.
PARTS = {"params": COLORS["params"], "unsharded_params": "#8da0cb", "grads": COLORS["grads"],
         "optimizer": COLORS["optimizer"]}
_MIB = 2**20


def _scale(max_bytes: float) -> tuple[str, float]:
    for unit, size in (("GiB", 2**30), ("MiB", _MIB), ("KiB", 2**10)):
        if max_bytes >= size:
            return unit, size
    return "B", 1


def _bar(ax, x: float, row: Mapping[str, int], scale: float, width: float, hatched: bool,
         moment: str) -> None:
    bottom = 0.0
    for part, colour in PARTS.items():
        if part == "unsharded_params" and moment == "steady":
            continue
        if part == "grads" and moment == "fwd":
            continue
        value = row.get(part, 0) / scale
        ax.bar(x, value, width, bottom=bottom, color=colour, alpha=0.55 if hatched else 1.0,
               hatch="//" if hatched else None, edgecolor="white" if not hatched else "k",
               linewidth=0.4)
        bottom += value


def _legend(ax, moment: str) -> None:
    shown = [p for p in PARTS if not (p == "unsharded_params" and moment == "steady")
             and not (p == "grads" and moment == "fwd")]
    handles = [plt.Rectangle((0, 0), 1, 1, color=PARTS[p]) for p in shown]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="k", hatch="//"))
    ax.legend(handles, shown + ["formula"], fontsize=7, loc="upper right")


def plot_ranks(reports: Sequence[Mapping[str, int]], formula: Sequence[Mapping[str, int]],
               title: str, moment: str = "steady") -> Figure:
    """One strategy: each rank's model states, measured (solid) beside the formula (hatched).

    ``moment="steady"`` after the optimizer step; ``"fwd"`` at the end of forward (FSDP's
    gathered full parameters alive, sharded gradients freed).
    """
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    top = max(sum(r.get(p, 0) for p in PARTS) for r in list(reports) + list(formula))
    unit, scale = _scale(top)
    for rank, (measured, predicted) in enumerate(zip(reports, formula)):
        _bar(ax, rank - 0.2, measured, scale, 0.38, False, moment)
        _bar(ax, rank + 0.2, predicted, scale, 0.38, True, moment)
    ax.set_xticks(range(len(reports)), [f"rank {r}" for r in range(len(reports))])
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    _legend(ax, moment)
    fig.tight_layout()
    return fig


def plot_strategies(results: Mapping[str, Sequence[Mapping[str, int]]],
                    formulas: Mapping[str, Sequence[Mapping[str, int]]], rank: int = 0,
                    title: str = "Model states of one rank") -> Figure:
    """Several strategies side by side: rank ``rank`` after the step and at the end of forward."""
    fig, axes = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI, sharey=True)
    names = list(results)
    top = max(sum(r[rank].get(p, 0) for p in PARTS) for r in list(results.values())
              + list(formulas.values()))
    unit, scale = _scale(top)
    for ax, moment, label in ((axes[0], "steady", "after the step"),
                              (axes[1], "fwd", "end of forward")):
        for i, name in enumerate(names):
            _bar(ax, i - 0.2, results[name][rank], scale, 0.38, False, moment)
            _bar(ax, i + 0.2, formulas[name][rank], scale, 0.38, True, moment)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(f"{title}: {label}", fontsize=9)
        _legend(ax, moment)
    axes[0].set_ylabel(unit)
    fig.tight_layout()
    return fig


def plot_comm(comm: Mapping[str, Mapping[str, int]], title: str = "Bytes handed to collectives per step") -> Figure:
    """Stacked bars of message bytes per collective type, one bar per strategy."""
    colours = {"all_reduce": "#c44e52", "all_gather": "#8172b3", "reduce_scatter": "#937860",
               "broadcast": "#da8bc3"}
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], 3.0), dpi=DPI)
    top = max([sum(c.values()) for c in comm.values()] + [1])
    unit, scale = _scale(top)
    for i, (name, by_type) in enumerate(comm.items()):
        bottom = 0.0
        for kind, colour in colours.items():
            value = by_type.get(kind, 0) / scale
            ax.bar(i, value, 0.6, bottom=bottom, color=colour, label=kind if i == 0 else None)
            bottom += value
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=7)
    ax.set_xticks(range(len(comm)), list(comm))
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
