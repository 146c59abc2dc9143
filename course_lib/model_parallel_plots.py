"""Figures for chapter 4 (``04_model_parallel``): pipeline Gantt charts, activation stash, TP bytes.

Same size and resolution as :mod:`course_lib.plots` (7×3.5 in, 80 dpi); each function returns
the ``Figure``.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.plots import DPI, FIGSIZE

__all__ = ["plot_pipeline_gantt", "plot_stash", "plot_tp_bytes"]

_F, _B, _IDLE, _XFER = "#4c72b0", "#dd8452", "#e6e6e6", "#c44e52"


def plot_pipeline_gantt(report, title: str | None = None) -> Figure:
    """One row per rank: forward (blue) and backward (orange) bars labelled with the
    micro-batch, transfer (red: the input was sent but had not arrived) on grey bubble (nothing
    to do) — drawn from the events the ranks recorded."""
    from course_lib.pipeline_measure import ready_times
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    span_ms = report.span * 1e3
    ready = ready_times(report.traces)
    for trace in report.traces:
        y = trace.rank
        ax.barh(y, span_ms, left=0, height=0.8, color=_IDLE)
        for kind, i, start, end in trace.waits:
            sent = max(start, ready[(trace.rank, kind, i)])
            if end > sent:
                ax.barh(y, (end - sent) * 1e3, left=sent * 1e3, height=0.8, color=_XFER)
        for kind, i, start, end in trace.events:
            ax.barh(y, (end - start) * 1e3, left=start * 1e3, height=0.8,
                    color=_F if kind == "F" else _B, edgecolor="white", linewidth=0.5)
            if (end - start) * 1e3 > span_ms / 60:
                ax.text((start + end) * 500, y, str(i), ha="center", va="center", fontsize=7,
                        color="white")
    ax.set_yticks(range(report.p), [f"rank {r}" for r in range(report.p)])
    ax.invert_yaxis()
    ax.set_xlabel("time since the first operation (ms)")
    ax.set_xlim(0, span_ms)
    ax.set_title(title or f"{report.schedule}, p={report.p}, m={report.m}: bubble measured "
                 f"{report.bubble:.2f}, formula {report.formula:.2f}", fontsize=10)
    ax.legend(handles=[Patch(color=_F, label="forward"), Patch(color=_B, label="backward"),
                       Patch(color=_XFER, label="transfer"), Patch(color=_IDLE, label="bubble")],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def plot_stash(reports: Mapping[str, object]) -> Figure:
    """Peak stashed activations per rank (MiB, measured), one group of bars per schedule."""
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    names = list(reports)
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        traces = reports[name].traces
        xs = [t.rank + (k - (len(names) - 1) / 2) * width for t in traces]
        bars = ax.bar(xs, [t.stash_peak_bytes / 2**20 for t in traces], width, label=name,
                      color=(_F, _B, "#55a868")[k % 3])
        for bar, t in zip(bars, traces):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{t.stash_peak_count} mb",
                    ha="center", va="bottom", fontsize=7)
    ranks = range(len(reports[names[0]].traces))
    ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
    ax.set_ylabel("MiB stashed at peak")
    ax.set_title("Activations held for backward (labels: micro-batches at peak)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_tp_bytes(degrees: Sequence[int], split: Sequence[int], replicated: Sequence[int],
                  comm: Sequence[int]) -> Figure:
    """Left: parameter bytes per rank (split + replicated) vs t. Right: bytes all-reduced per step."""
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI)
    labels = [str(t) for t in degrees]
    left.bar(labels, [b / 2**20 for b in split], color=_F, label="split linears")
    left.bar(labels, [b / 2**20 for b in replicated], bottom=[b / 2**20 for b in split],
             color="#8c8c8c", label="replicated")
    left.set_xlabel("tensor-parallel degree t")
    left.set_ylabel("MiB of parameters per rank")
    left.legend(fontsize=8)
    right.bar(labels, [b / 2**20 for b in comm], color=_B)
    right.set_xlabel("tensor-parallel degree t")
    right.set_ylabel("MiB all-reduced per step")
    fig.suptitle("Tensor parallelism: memory shrinks as 1/t, traffic does not", fontsize=10)
    fig.tight_layout()
    return fig
