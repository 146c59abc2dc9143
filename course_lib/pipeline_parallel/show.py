"""Chapter 4's pipeline figures and explorer: Gantt charts, activation stash, a widget.

:func:`pipeline_explorer` (tests call it): stages × micro-batches × schedule → a real run on
``p`` processes, its Gantt chart and the measured bubble beside ``(p-1)/(m+p-1)``;
:func:`pipeline_widget` puts sliders in front of it. Figures are drawn from the events the
ranks recorded, never recomputed.
"""
from __future__ import annotations

from typing import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.common.models import GPTConfig
from course_lib.display import DPI, FIGSIZE, FONT_MIN, PALE, PALETTE, WIDGET_STYLE
from course_lib.pipeline_parallel.measure import (BUBBLE_CONFIG, PipelineReport, measure_pipeline,
                                                  ready_times)
from course_lib.pipeline_parallel.schedules import SCHEDULES
from course_lib.common.plots import legible

__all__ = ["pipeline_explorer", "pipeline_widget", "plot_pipeline_gantt", "plot_stash"]


def pipeline_explorer(p: int = 2, m: int = 4, schedule: str = "gpipe",
                      config: GPTConfig | str = BUBBLE_CONFIG, micro_batch: int = 2, steps: int = 1,
                      plot: bool = True) -> tuple[PipelineReport, object]:
    """Run the hand-written pipeline and return ``(report, figure or None)``.

    Defaults favour a quick answer (2 sequences per micro-batch, one recorded step); the
    chapter's bubble measurement uses :func:`measure_pipeline`'s larger defaults.
    """
    report = measure_pipeline(p, m, schedule, config, micro_batch=micro_batch, steps=steps)
    return report, (plot_pipeline_gantt(report) if plot else None)


def pipeline_widget():
    """Sliders for p and m and a schedule choice; each change runs a real pipeline."""
    import ipywidgets as w
    from IPython.display import display

    p = w.Dropdown(options=[1, 2, 4], value=2, description="stages p", style=WIDGET_STYLE)
    m = w.IntSlider(value=4, min=1, max=12, description="micro-batches m", style=WIDGET_STYLE)
    schedule = w.ToggleButtons(options=list(SCHEDULES), value="gpipe", description="schedule",
                               style=WIDGET_STYLE)
    out = w.Output()

    def show(_=None) -> None:
        with out:
            out.clear_output(wait=True)
            report, fig = pipeline_explorer(p.value, m.value, schedule.value)
            print(report.summary())
            display(fig)
            plt.close(fig)

    for control in (p, m, schedule):
        control.observe(show, names="value")
    show()
    return w.VBox([w.HBox([p, schedule]), m, out])


_F, _B, _IDLE, _XFER = PALETTE[0], PALETTE[1], PALE, PALETTE[5]


@legible
def plot_pipeline_gantt(report, title: str | None = None) -> Figure:
    """One row per rank: forward (blue) and backward (orange) bars labelled with the
    micro-batch, transfer (red: the input was sent but had not arrived) on grey bubble (nothing
    to do) — drawn from the events the ranks recorded."""
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
                ax.text((start + end) * 500, y, str(i), ha="center", va="center", fontsize=FONT_MIN,
                        color="white")
    ax.set_yticks(range(report.p), [f"rank {r}" for r in range(report.p)])
    ax.invert_yaxis()
    ax.set_xlabel("time since the first operation (ms)")
    ax.set_xlim(0, span_ms)
    ax.set_title(title or f"{report.schedule}, p={report.p}, m={report.m}: bubble measured "
                 f"{report.bubble:.2f}, formula {report.formula:.2f}", fontsize=FONT_MIN + 1)
    ax.legend(handles=[Patch(color=_F, label="forward"), Patch(color=_B, label="backward"),
                       Patch(color=_XFER, label="transfer"), Patch(color=_IDLE, label="bubble")],
              fontsize=FONT_MIN, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


@legible
def plot_stash(reports: Mapping[str, object]) -> Figure:
    """Peak stashed activations per rank (MiB, measured), one group of bars per schedule."""
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    names = list(reports)
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        traces = reports[name].traces
        xs = [t.rank + (k - (len(names) - 1) / 2) * width for t in traces]
        bars = ax.bar(xs, [t.stash_peak_bytes / 2**20 for t in traces], width, label=name,
                      color=(_F, _B, PALETTE[2])[k % 3])
        for bar, t in zip(bars, traces):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{t.stash_peak_count} mb",
                    ha="center", va="bottom", fontsize=FONT_MIN)
    ranks = range(len(reports[names[0]].traces))
    ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
    ax.set_ylabel("MiB stashed at peak")
    ax.margins(y=0.15)  # room for the bar labels under the title
    ax.set_title("Activations held for backward (labels: micro-batches at peak)", fontsize=FONT_MIN + 1)
    ax.legend(fontsize=FONT_MIN, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig
