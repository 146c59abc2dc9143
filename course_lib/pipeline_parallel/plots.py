"""Chapter 4's idealised schedule: the order a generator gives, laid out on an ideal machine.

:func:`ideal_timeline` places every ("F", i) / ("B", i) of ``ops(schedule, p, m, rank)`` at the
earliest moment its rank is free and its input exists (forward i after stage r-1's forward i;
backward i after stage r+1's backward i, or the last stage's own forward i), with fixed costs.
An order that waits for something that never comes is an error naming the rank. :func:`plot_schedule`
draws it: the Gantt chart beside the measured one, with no timer involved.
"""
from __future__ import annotations

from typing import Callable

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.common.checks import positive_int
from course_lib.display import DPI, FONT_MIN, PALE, PALETTE
from course_lib.pipeline_parallel.schedules import lay_out, schedule_ops
from course_lib.common.plots import legible

__all__ = ["ideal_timeline", "plot_schedule"]

_F, _B, _IDLE = PALETTE[0], PALETTE[1], PALE   # the measured Gantt chart's colours


def ideal_timeline(schedule: str = "1f1b", p: int = 4, m: int = 8, ops: Callable = schedule_ops,
                   forward_cost: float = 1.0, backward_cost: float = 2.0) -> dict:
    """``{"events": [(rank, kind, i, start, end)], "span", "bubble", "in_flight": [per rank]}``."""
    positive_int(p, "p")
    positive_int(m, "m")
    orders = [list(ops(schedule, p, m, rank)) for rank in range(p)]
    want = sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
    for rank, order in enumerate(orders):
        if sorted(order) != want:
            raise ValueError(f"rank {rank}'s order must hold every ('F', i) and ('B', i) for i "
                             f"< {m} exactly once; it has {len(order)} operations")
    events = lay_out(orders, lambda rank, kind, i: forward_cost if kind == "F" else backward_cost)
    span = max(end for *_, end in events)
    busy = m * (forward_cost + backward_cost)
    in_flight = []
    for order in orders:
        count = peak = 0
        for kind, _ in order:
            count += 1 if kind == "F" else -1
            peak = max(peak, count)
        in_flight.append(peak)
    return {"events": events, "span": span, "bubble": 1 - busy / span, "in_flight": in_flight,
            "schedule": schedule, "p": p, "m": m}


@legible
def plot_schedule(schedule: str = "1f1b", p: int = 4, m: int = 8, ops: Callable = schedule_ops,
                  forward_cost: float = 1.0, backward_cost: float = 2.0) -> Figure:
    """One row per stage: the operations of ``ops(schedule, p, m, rank)`` on an ideal machine
    (forward ``forward_cost``, backward ``backward_cost``, messages free); grey is the bubble."""
    t = ideal_timeline(schedule, p, m, ops, forward_cost, backward_cost)
    fig, ax = plt.subplots(figsize=(7.0, 1.3 + 0.45 * p), dpi=DPI)
    unit_px = 6.0 * DPI / t["span"]                       # pixels per cost unit, roughly
    for rank in range(p):
        ax.barh(rank, t["span"], height=0.8, color=_IDLE)
        ax.text(t["span"] * 1.01, rank, f"≤ {t['in_flight'][rank]} in flight", va="center",
                fontsize=FONT_MIN)
    for rank, kind, i, start, end in t["events"]:
        ax.barh(rank, end - start, left=start, height=0.8, color=_F if kind == "F" else _B,
                edgecolor="white", linewidth=0.5, gid=f"op-{rank}-{kind}{i}")
        if (end - start) * unit_px >= 8 * len(str(i)):   # room for the label at 9 pt
            ax.text((start + end) / 2, rank, str(i), ha="center", va="center", fontsize=FONT_MIN,
                    color="white")
    ax.set_yticks(range(p), [f"stage {r}" for r in range(p)], fontsize=FONT_MIN)
    ax.invert_yaxis()
    ax.set_xlim(0, t["span"] * 1.2)
    ax.tick_params(axis="x", labelsize=FONT_MIN)
    ax.set_xlabel(f"time in units of one forward (backward = {backward_cost:g}); "
                  "labels: micro-batch", fontsize=FONT_MIN)
    ax.set_title(f"{schedule}, p={p}, m={m}, idealised: bubble {t['bubble']:.2f} of the step",
                 fontsize=FONT_MIN + 1)
    fig.legend(handles=[Patch(color=_F, label="forward"), Patch(color=_B, label="backward"),
                        Patch(color=_IDLE, label="bubble")], fontsize=FONT_MIN, ncol=3,
               loc="lower center", frameon=False)
    fig.tight_layout(rect=(0, 0.3 / fig.get_figheight(), 1, 1))
    return fig
