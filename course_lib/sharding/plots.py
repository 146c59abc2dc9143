"""Chapter 3's conceptual figures, drawn from :func:`~course_lib.sharding.holdings.zero_holdings`.

:func:`plot_zero_holdings` is the ZeRO paper's Figure 1 from real objects: for each stage, one
band per rank, one stripe per category, coloured where that rank holds those parameters' bytes.
:func:`plot_fsdp_gather_free` shows one FSDP step unit by unit: when each unit's full parameters
exist (all-gathered, then freed), in the order the events ran, and the bytes that makes.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.display import COLORS, DPI, FONT_MIN, PALE
from course_lib.memory.report import format_bytes
from course_lib.common.plots import legible

__all__ = ["plot_zero_holdings", "plot_fsdp_gather_free", "STAGE_TITLES"]

STAGE_TITLES = {0: "ZeRO-0 (DDP): nothing sharded", 1: "ZeRO-1: + optimizer states sharded",
                2: "ZeRO-2: + gradients sharded", 3: "ZeRO-3 (FSDP): + parameters sharded"}
_CATS = ("params", "grads", "optimizer")
_STRIPE = 0.26


def _stage_panel(ax, stage: int, ranks: Sequence[Mapping]) -> None:
    psi = ranks[0]["psi"]
    for rank, held in enumerate(ranks):
        top = -rank
        for j, cat in enumerate(_CATS):
            y = top - j * _STRIPE
            ax.add_patch(plt.Rectangle((0, y - _STRIPE * 0.45), 1, _STRIPE * 0.9, fc=PALE,
                                       ec="none"))
            for a, b in held["held"][cat]:
                ax.add_patch(plt.Rectangle((a / psi, y - _STRIPE * 0.45), (b - a) / psi,
                                           _STRIPE * 0.9, fc=COLORS[cat], ec="none",
                                           gid=f"hold-{stage}-{rank}-{cat}"))
        total = sum(held["bytes"].values())
        ax.text(1.03, top - _STRIPE, format_bytes(total), va="center", fontsize=FONT_MIN)
    for _, start, _ in ranks[0]["units"][1:]:             # FSDP's unit boundaries
        ax.axvline(start / psi, color="black", lw=0.6, ls=":")
    ax.set_yticks([-r - _STRIPE for r in range(len(ranks))],
                  [f"rank {r}" for r in range(len(ranks))], fontsize=FONT_MIN)
    ax.tick_params(axis="y", length=0)
    ax.set_xticks([0, 0.5, 1], ["0", "Ψ/2", "Ψ"], fontsize=FONT_MIN)
    ax.set_xlim(0, 1.32)
    ax.set_ylim(-len(ranks) + 1 - 3 * _STRIPE, 0.2)
    ax.set_title(STAGE_TITLES.get(stage, f"stage {stage}"), fontsize=FONT_MIN + 1)
    ax.spines[["top", "right", "left"]].set_visible(False)


@legible
def plot_zero_holdings(holdings: Mapping[int, Sequence[Mapping]]) -> Figure:
    """``{stage: [rank 0's holdings, ...]}``: which parameters' bytes each rank holds, per stage.

    x is the model's flat parameter index (Ψ parameters); a coloured stripe means this rank
    keeps that category's bytes for those parameters after the optimizer step; the text is the
    rank's total, from its tensors' storages. Dotted lines: FSDP's unit boundaries.
    """
    stages = sorted(holdings)
    if not stages or not all(holdings[s] for s in stages):
        raise ValueError("nothing to draw: pass zero_holdings(...), {stage: [one dict per rank]}")
    world = len(holdings[stages[0]])
    cols = 2 if len(stages) > 1 else 1
    rows = -(-len(stages) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.6, 0.9 + rows * (0.55 + 0.62 * world)),
                             dpi=DPI, squeeze=False)
    for ax, stage in zip(axes.flat, stages):
        _stage_panel(ax, stage, holdings[stage])
        ax.set_xlabel("flat parameter index", fontsize=FONT_MIN)
    for ax in list(axes.flat)[len(stages):]:
        ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in _CATS]
    fig.suptitle(f"{world} ranks: what each one holds after a step", fontsize=FONT_MIN + 2)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / fig.get_figheight()))
    fig.legend(handles, ["parameters", "gradients", "optimizer states"], ncol=3,
               fontsize=FONT_MIN + 1, loc="upper center", frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.3 / fig.get_figheight()))
    return fig


@legible
def plot_fsdp_gather_free(holding: Mapping, title: str | None = None) -> Figure:
    """One rank's ZeRO-3 step (``zero_holdings(...)[3][rank]``): when each unit's full
    parameters exist, in the order of its events, and the full-parameter bytes after each."""
    events, units = holding["events"], holding["units"]
    if not events:
        raise ValueError("nothing to draw: pass a stage-3 holding (zero_holdings(...)[3][rank]), "
                         "whose FSDP units logged their events")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.0, 1.9 + 0.42 * len(units)), dpi=DPI,
                                      sharex=True, height_ratios=(len(units), 2.2))
    opened, gathers = {}, {}
    for step, (kind, unit, _) in enumerate(events):
        y = len(units) - 1 - unit
        if kind == "all-gather":
            opened[unit] = step
            gathers[unit] = gathers.get(unit, 0) + 1
        elif kind == "free" and unit in opened:
            start = opened.pop(unit)
            phase = "forward" if gathers[unit] == 1 else "backward"
            top.add_patch(plt.Rectangle((start, y - 0.3), step - start, 0.6,
                                        fc=COLORS["params"] if phase == "forward" else COLORS["grads"],
                                        gid=f"gathered-{unit}-{phase}"))
        elif kind == "reduce-scatter":
            top.plot(step, y, marker="v", color="black", ms=7, ls="none")
    top.set_yticks(range(len(units)), [name for name, *_ in reversed(units)], fontsize=FONT_MIN)
    top.set_ylim(-0.6, len(units) - 0.4)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS["params"]),
               plt.Rectangle((0, 0), 1, 1, color=COLORS["grads"]),
               plt.Line2D([], [], marker="v", color="black", ls="none")]
    top.legend(handles, ["gathered for forward", "gathered for backward", "reduce-scatter"],
               fontsize=FONT_MIN, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0),
               frameon=False)
    alive = [nbytes / 2**10 for *_, nbytes in events]
    bottom.step(range(len(events)), alive, where="post", color="black")
    every = sum(max(b for k, u, b in _unit_bytes(events) if u == i) for i in range(len(units)))
    bottom.axhline(every / 2**10, color="black", ls="--", lw=0.8)
    bottom.text(0, every / 2**10, " all units gathered at once", va="bottom", fontsize=FONT_MIN)
    bottom.set_ylim(0, every / 2**10 * 1.35)
    bottom.set_ylabel("full params\n(KiB)", fontsize=FONT_MIN)
    bottom.set_xlabel("events of one training step, in the order they ran", fontsize=FONT_MIN + 1)
    bottom.set_xlim(-0.5, len(events) - 0.5)
    bottom.tick_params(labelsize=FONT_MIN)
    if title:
        fig.suptitle(title, fontsize=FONT_MIN + 2)
    fig.tight_layout()
    return fig


def _unit_bytes(events):
    """(kind, unit, that unit's own full bytes after the event), from the running totals."""
    own, before = {}, 0
    for kind, unit, total in events:
        own[unit] = own.get(unit, 0) + total - before
        before = total
        yield kind, unit, own[unit]
