"""Chapter 5's link-sweep figure: measured step time per link, DDP beside FSDP, with predictions.

Takes the rows of :func:`course_lib.link_sweep.link_sweep` (live or recorded; never recomputes
them) and returns the matplotlib figure (7 x 3.5 inches at 80 dpi, like the chapter's others).
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.link_sweep import LinkRow

__all__ = ["plot_link_sweep"]

_COLORS = {"ddp": "tab:blue", "fsdp": "tab:orange"}


def plot_link_sweep(rows: Sequence[LinkRow], title: str = "") -> Figure:
    """Bars: measured step (ms) per link and strategy; black ticks: the α-β prediction.

    Above the slowest link: how much longer FSDP's step is than DDP's, and its byte ratio.
    """
    links = list(dict.fromkeys(r.link for r in rows))
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=80)
    for k, strategy in enumerate(strategies):
        for i, link in enumerate(links):
            row = next((r for r in rows if r.link == link and r.strategy == strategy), None)
            if row is None:
                continue
            x = i + (k - (len(strategies) - 1) / 2) * width
            ax.bar(x, row.step_s * 1e3, width * 0.9, color=_COLORS.get(strategy, "grey"),
                   label=strategy.upper() if i == 0 else None)
            ax.plot([x - width * 0.45, x + width * 0.45], [row.predicted_s * 1e3] * 2, "k-",
                    lw=2, label="α-β prediction" if (i, k) == (0, 0) else None)
    slow = links[-1]
    pair = {r.strategy: r for r in rows if r.link == slow}
    if {"ddp", "fsdp"} <= set(pair):
        ddp, fsdp = pair["ddp"], pair["fsdp"]
        ax.annotate(f"FSDP +{(fsdp.step_s - ddp.step_s) * 1e3:.0f} ms\n"
                    f"({fsdp.sent_bytes / ddp.sent_bytes:.1f}x the bytes)",
                    (len(links) - 1, max(ddp.step_s, fsdp.step_s, fsdp.predicted_s) * 1e3),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(range(len(links)), links, fontsize=8)
    ax.set_ylabel("training step (ms)")
    ax.margins(y=0.25)
    ax.set_title(title or "One training step, two nodes, one link", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
