"""Chapter 00's figure: the ranks of one run and what one all-reduce did to their tensors.

:func:`plot_all_reduce` draws the values a real run returned, rank by rank: one box per rank
before the collective, the collective in the middle, one box per rank after it. Nothing is
computed here; the number of rows is the world size of the run passed in.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from course_lib.display import DPI, FONT_MIN, PALETTE, SUM_COLOR, ink
from course_lib.common.plots import legible

__all__ = ["plot_all_reduce"]


def _box(ax, x: float, y: float, text: str, color: str, gid: str) -> None:
    ax.add_patch(FancyBboxPatch((x - 0.9, y - 0.32), 1.8, 0.64, boxstyle="round,pad=0.02",
                                fc=color, ec="black", lw=0.6, gid=gid))
    ax.text(x, y, text, ha="center", va="center", fontsize=FONT_MIN + 1,
            color=ink(color))


@legible
def plot_all_reduce(results: Sequence[tuple[float, float]], op: str = "SUM") -> Figure:
    """``results[r] = (before, after)``: what rank ``r`` held before and after ``all_reduce``.

    Each rank is one row; an arrow leads from every rank's tensor into the collective and from
    the collective back to every rank (every rank receives the result: no rank is special).
    """
    if not results:
        raise ValueError("nothing to draw: pass the list run(...) returned, one (before, after) "
                         "pair per rank")
    n = len(results)
    fig, ax = plt.subplots(figsize=(7.0, 1.2 + 0.55 * n), dpi=DPI)
    mid = (n - 1) / 2
    ax.add_patch(FancyBboxPatch((3.0, mid - 0.45), 2.0, 0.9, boxstyle="round,pad=0.02",
                                fc="white", ec="black", lw=1.0, gid="collective"))
    ax.text(4.0, mid, f"all_reduce\n({op})", ha="center", va="center", fontsize=FONT_MIN + 1)
    for rank, (before, after) in enumerate(results):
        y = n - 1 - rank
        color = PALETTE[rank % len(PALETTE)]
        _box(ax, 1.0, y, f"rank {rank}: {before:g}", color, f"before-{rank}")
        _box(ax, 7.0, y, f"rank {rank}: {after:g}", SUM_COLOR, f"after-{rank}")
        arrow = {"arrowstyle": "->", "color": color, "lw": 1.0}
        ax.annotate("", xy=(3.0, mid), xytext=(1.9, y), arrowprops=arrow)
        ax.annotate("", xy=(6.1, y), xytext=(5.0, mid), arrowprops=arrow)
    ax.text(1.0, n - 0.35, "before", ha="center", va="bottom", fontsize=FONT_MIN + 1)
    ax.text(7.0, n - 0.35, "after", ha="center", va="bottom", fontsize=FONT_MIN + 1)
    ax.set_xlim(-0.1, 8.1)
    ax.set_ylim(-0.6, n + 0.1)
    ax.axis("off")
    ax.set_title(f"world size {n}: {n} processes (ranks 0 … {n - 1}), one collective",
                 fontsize=FONT_MIN + 2)
    fig.tight_layout()
    return fig
