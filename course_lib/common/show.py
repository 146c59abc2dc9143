"""The per-rank timeline as a figure: one band per rank, a row per lane (compute, comm).

A Gantt chart of :class:`~course_lib.common.timeline.Span` events from a real run: time on x
(milliseconds from the first event), ranks top to bottom. Overlapping spans of one lane (two
bucket all-reduces in flight) get thinner rows side by side. Colours group spans by the first
word of their name ("backward", "F", "all_reduce").
"""
from __future__ import annotations

from typing import Iterable, Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.common.timeline import Span, lane_order, lane_slots, merge
from course_lib.display import DPI, FIGSIZE, FONT_MIN, GREY, PALETTE
from course_lib.common.plots import legible

__all__ = ["plot_timeline", "timeline_rows"]

#: Compute kinds take the palette's colours but vermillion, which the first comm kind takes.
COMPUTE_COLORS = tuple(PALETTE[i] for i in (0, 1, 2, 3, 4, 6))
COMM_COLORS = (PALETTE[5], GREY, PALETTE[7])
#: Kinds every chapter names alike keep one colour: forward blue, backward orange (the pipeline
#: Gantt's), the optimizer step and a weight-gradient step green.
KIND_COLORS = {"forward": PALETTE[0], "F": PALETTE[0], "backward": PALETTE[1], "B": PALETTE[1],
               "step": PALETTE[2], "W": PALETTE[2]}


def _kind(name: str) -> str:
    return name.split()[0] if name.split() else name


def timeline_rows(spans: Iterable[Span]) -> list[tuple[int, str]]:
    """The (rank, lane) rows the figure draws, top to bottom."""
    return sorted({(s.rank, s.lane) for s in spans}, key=lambda r: (r[0], lane_order(r[1])))


@legible
def plot_timeline(spans: Iterable[Span], title: str = "What every rank did",
                  colors: Mapping[str, str] | None = None) -> Figure:
    """Draw ``spans`` (any ranks, already merged or not); returns the figure. The y labels
    read ``rank r · lane``: one band of rows per rank."""
    spans = merge(spans)
    if not spans:
        raise ValueError("no spans to draw: was the Timeline active while the step ran?")
    rows = timeline_rows(spans)
    slots = lane_slots(spans)
    depth = {row: 1 + max(sl for s, sl in zip(spans, slots) if (s.rank, s.lane) == row)
             for row in rows}
    compute_kinds = sorted({_kind(s.name) for s in spans if s.lane != "comm"})
    comm_kinds = sorted({_kind(s.name) for s in spans if s.lane == "comm"})
    palette = {k: COMPUTE_COLORS[i % len(COMPUTE_COLORS)] for i, k in enumerate(compute_kinds)}
    palette.update({k: c for k, c in KIND_COLORS.items() if k in palette})
    palette.update({k: COMM_COLORS[i % len(COMM_COLORS)] for i, k in enumerate(comm_kinds)})
    palette.update(colors or {})
    height = max(FIGSIZE[1], 0.45 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], height), dpi=DPI)
    y_of = {row: len(rows) - 1 - k for k, row in enumerate(rows)}
    for s, slot in zip(spans, slots):
        row = (s.rank, s.lane)
        h = 0.8 / depth[row]
        y = y_of[row] - 0.4 + slot * h
        ax.broken_barh([(s.t0 * 1e3, max((s.t1 - s.t0) * 1e3, 1e-3))], (y, h * 0.92),
                       facecolors=palette[_kind(s.name)], edgecolor="white", linewidth=0.3)
    ax.set_yticks([y_of[r] for r in rows], [f"rank {r} · {lane}" for r, lane in rows])
    for k in range(1, len(rows)):                       # a line between ranks' bands
        if rows[k][0] != rows[k - 1][0]:
            ax.axhline(y_of[rows[k]] + 0.5, color="black", linewidth=0.6)
    ax.set_xlabel("time since the first event (ms)")
    ax.set_xlim(left=0)
    ax.set_title(title, fontsize=FONT_MIN + 1)
    ax.legend(handles=[Patch(color=palette[k], label=k) for k in compute_kinds + comm_kinds],
              fontsize=FONT_MIN, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig
