"""Chapter 1's figures and widget: what is alive, measured against predicted, over time.

Each figure function returns the ``Figure`` (in a notebook assign it, ``fig = plot_...``, and
the inline backend shows it once). :func:`memory_explorer` (tests call it) measures one training
step of a preset and predicts it, in any precision and recompute mode; :func:`inference_explorer`
measures one forward of the same preset (the widget's inference row); :func:`memory_widget`
puts dropdowns in front of them.
"""
from __future__ import annotations

import textwrap
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.common.models import PRESETS, RECOMPUTE, get_config
from course_lib.display import COLORS, DPI, FIGSIZE, FONT_MIN, GREY, WIDGET_STYLE
from course_lib.memory import predict
from course_lib.memory.report import MemoryReport, byte_unit, format_bytes
from course_lib.memory.tracker import measure_inference, measure_step
from course_lib.common.plots import legible

__all__ = ["plot_stacked", "plot_measured_vs_predicted", "plot_timeline", "plot_scaling",
           "plot_recompute", "plot_bytes_per_param", "memory_explorer", "inference_explorer", "training_vs_inference",
           "show_memory_explorer", "memory_widget"]

_STACK = tuple(COLORS)


def _stacked(labels: Sequence[str], rows: Sequence[Mapping[str, int]], title: str):
    """A figure of one stacked bar per row (bytes per category), its legend beside it."""
    unit, scale = byte_unit(max(sum(r.get(k, 0) for k in _STACK) for r in rows))
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    bottoms = [0.0] * len(rows)
    for key in _STACK:
        heights = [row.get(key, 0) / scale for row in rows]
        if not any(heights):
            continue
        ax.bar(labels, heights, bottom=bottoms, color=COLORS[key], label=key, edgecolor="white",
               linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend(fontsize=FONT_MIN, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig, ax


@legible
def plot_stacked(moments: Mapping[str, Mapping[str, int]], title: str = "What is alive") -> Figure:
    """One stacked bar per named moment ``{category: bytes}`` (e.g. each report's peak breakdown).

    Stack only things alive at the same moment: a report's category totals never coexist
    (gradients appear as activations are freed), so their sum overstates memory.
    """
    fig, _ = _stacked(list(moments), list(moments.values()), title)
    fig.tight_layout()
    return fig


@legible
def plot_measured_vs_predicted(measured: Mapping[str, int], predicted: Mapping[str, int],
                               keys: Sequence[str] = ("params", "grads", "optimizer", "activations", "peak"),
                               title: str = "Measured vs predicted") -> Figure:
    """Grouped bars per category: the measurement (solid) beside the prediction (hatched)."""
    unit, scale = byte_unit(max(max(measured[k], predicted[k]) for k in keys))
    xs = range(len(keys))
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    colors = [COLORS.get(k, GREY) for k in keys]
    ax.bar([x - 0.2 for x in xs], [measured[k] / scale for k in keys], 0.4, color=colors, label="measured")
    ax.bar([x + 0.2 for x in xs], [predicted[k] / scale for k in keys], 0.4, color="white",
           edgecolor=colors, hatch="//", label="predicted")
    ax.set_xticks(list(xs), list(keys))
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend(fontsize=FONT_MIN)
    fig.tight_layout()
    return fig


@legible
def plot_timeline(report, title: str = "Memory through two training steps") -> Figure:
    """Stacked bars of every category after each phase of :func:`measure_step`, then the peak."""
    short = {"forward": "fwd", "backward": "bwd"}   # "1 backward" at 11 pt is wider than a bar
    labels = ["\n".join(short.get(w, w) for w in name.split()) for name, _ in report.timeline]
    labels += ["peak"]
    fig, ax = _stacked(labels, [snap for _, snap in report.timeline] + [report.peak_breakdown],
                       title)
    ax.tick_params(axis="x", labelsize=FONT_MIN)
    ax.set_xlabel("after each phase (fwd: forward, bwd: backward)")
    fig.tight_layout()
    return fig


@legible
def plot_scaling(series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
                 title: str = "Activation memory: measured (dots) vs predicted (lines)") -> Figure:
    """One panel per entry of ``series``: ``x-axis label -> (xs, measured bytes, predicted bytes)``.

    Panels share the y axis, so growth rates can be compared by eye.
    """
    unit, scale = byte_unit(max(max(m) for _, m, _ in series.values()))
    fig, axes = plt.subplots(1, len(series), figsize=FIGSIZE, dpi=DPI, squeeze=False, sharey=True)
    for ax, (name, (xs, measured, predicted)) in zip(axes[0], series.items()):
        ax.plot(xs, [p / scale for p in predicted], "-", color=COLORS["activations"], label="predicted")
        ax.plot(xs, [m / scale for m in measured], "o", color="black", label="measured")
        ax.set_xlabel(textwrap.fill(name, 20))  # long labels on two lines: no overlap
    axes[0][0].set_ylabel(unit)
    axes[0][0].legend(fontsize=FONT_MIN)
    fig.suptitle(title, fontsize=FONT_MIN + 1)
    fig.tight_layout()
    return fig


@legible
def plot_bytes_per_param(reports: Mapping[str, MemoryReport],
                         keys: Sequence[str] = ("params", "grads", "optimizer")) -> Figure:
    """One row of squares per measured report: one square per byte per parameter, per category.

    ``reports`` maps a label (e.g. "fp32 · adam") to a :class:`MemoryReport`; each category gets
    ``round(report.per_param(key))`` squares, read from the tracker's bytes (the exact value,
    step counters included, is printed at the end of the row).
    """
    if not reports:
        raise ValueError("nothing to draw: pass {label: MemoryReport}, e.g. the runs of section 4")
    rows = list(reports.items())
    fig, ax = plt.subplots(figsize=(7.0, 0.9 + 0.42 * len(rows)), dpi=DPI)
    widest = 0
    for y, (label, report) in enumerate(rows):
        x = 0
        for key in keys:
            n = round(report.per_param(key))
            for i in range(n):
                ax.add_patch(plt.Rectangle((x + i, -y - 0.4), 0.9, 0.8, fc=COLORS[key],
                                           ec="white", lw=1.5, gid=f"byte-{y}-{key}"))
            x += n + (0.4 if n else 0)
        total = sum(report.per_param(k) for k in keys)
        parts = " + ".join(str(round(report.per_param(k))) for k in keys)
        ax.text(x + 0.3, -y, f"{parts} = {total:.2f} B/param", va="center", fontsize=FONT_MIN)
        widest = max(widest, x)
    ax.set_yticks([-y for y in range(len(rows))], [label for label, _ in rows], fontsize=FONT_MIN)
    ax.set_xlim(-0.2, widest + 13.5)  # room for the sum at 11 pt
    ax.set_ylim(-len(rows) + 0.4, 0.6)
    ax.set_xlabel("bytes per parameter (one square = 1 byte, measured)", fontsize=FONT_MIN + 1)
    ax.set_xticks([])
    ax.spines[["top", "right", "bottom"]].set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in keys]
    ax.legend(handles, keys, fontsize=FONT_MIN, ncol=len(keys), loc="lower center",
              bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    return fig


_INTERACTIVE = ("tiny", "small", "medium")


@legible
def plot_recompute(config, rows: Sequence[Mapping], batch_sizes: Sequence[int] = (1, 2, 4, 8, 16),
                   seq_len: int = 64, precision: str = "fp32") -> Figure:
    """Recompute instead of store: activations (left) and peak (right) over the batch size, one
    colour per mode. Lines: :mod:`~course_lib.memory.predict`; dots: the measured ``rows`` of
    :func:`course_lib.memory.recompute.tradeoff` at ``seq_len``. Bytes only: times depend on the
    machine and are printed, not drawn into a stored figure."""
    modes = list(dict.fromkeys(r["recompute"] for r in rows))
    colors = dict(zip(("none", "selective", "full"), (COLORS["activations"], COLORS["optimizer"],
                                                        COLORS["params"])))
    lines = {"activations": lambda m, b: predict.activation_bytes(config, b, seq_len, precision, m),
             "peak": lambda m, b: predict.peak_bytes(config, b, seq_len, precision, "adam", m)}
    fig, axes = plt.subplots(1, 2, figsize=(FIGSIZE[0] * 1.4, FIGSIZE[1]), dpi=DPI)
    for ax, (key, predicted) in zip(axes, lines.items()):
        curves = {m: [predicted(m, b) for b in batch_sizes] for m in modes}
        unit, scale = byte_unit(max(max(v) for v in curves.values()))
        for m in modes:
            ax.plot(batch_sizes, [p / scale for p in curves[m]], color=colors[m], label=f"{m} (predicted)")
            mine = [r for r in rows if r["recompute"] == m and r["seq_len"] == seq_len]
            ax.scatter([r["batch"] for r in mine], [r[key] / scale for r in mine], color=colors[m],
                       edgecolor="black", zorder=3)
        ax.set_xlabel(f"batch size (seq_len {seq_len})")
        ax.set_ylabel(f"{key} ({unit}); dots measured")
    axes[0].legend(fontsize=FONT_MIN)
    fig.tight_layout()
    return fig


def memory_explorer(preset: str = "tiny", batch_size: int = 8, seq_len: int = 64,
                    precision: str = "fp32", optimizer: str = "adam", attention: str = "sdpa",
                    recompute: str = "none") -> tuple[MemoryReport, dict[str, int]]:
    """Measure two real training steps of a preset and predict them: ``(report, predicted)``."""
    config = get_config(preset).replace(attention=attention)
    report = measure_step(config, (batch_size, seq_len), precision=precision, optimizer=optimizer,
                          recompute=recompute)
    return report, predict.predict_step(config, batch_size, seq_len, precision, optimizer, recompute)


def inference_explorer(preset: str = "tiny", batch_size: int = 8, seq_len: int = 64,
                       precision: str = "fp32", attention: str = "sdpa") -> MemoryReport:
    """Measure one forward of the same preset and batch under ``no_grad``: the inference row."""
    config = get_config(preset).replace(attention=attention)
    return measure_inference(config, (batch_size, seq_len), precision=precision)


def training_vs_inference(training: MemoryReport, inference: MemoryReport) -> str:
    """Two rows and a ratio: the peak of a training step against the peak of one forward."""
    weights = predict.inference_bytes(inference.n_params, inference.info["precision"])
    return (f"{'training peak':<16}{training['peak']:>14,} B{format_bytes(training['peak']):>12}\n"
            f"{'inference peak':<16}{inference['peak']:>14,} B{format_bytes(inference['peak']):>12}"
            f"   (weights alone: {weights:,} B)\n"
            f"training needs {training['peak'] / inference['peak']:.1f}× the memory of inference")


def show_memory_explorer(preset: str = "tiny", batch_size: int = 8, seq_len: int = 64,
                         precision: str = "fp32", optimizer: str = "adam",
                         attention: str = "sdpa", recompute: str = "none") -> None:
    """Print the measured-vs-predicted table of :func:`memory_explorer`, the inference row
    (:func:`training_vs_inference`) and draw the bars."""
    try:
        report, predicted = memory_explorer(preset, batch_size, seq_len, precision, optimizer,
                                            attention, recompute)
        inference = inference_explorer(preset, batch_size, seq_len, precision, attention)
    except (ValueError, MemoryError) as err:  # e.g. seq_len longer than the preset allows
        print(f"{type(err).__name__}: {err}")
        return
    print(report.table(predicted))
    print(training_vs_inference(report, inference))
    plot_measured_vs_predicted(report, predicted, title=f"{preset}, {precision}, {optimizer}, "
                               f"recompute {recompute}: batch {batch_size} × {seq_len} tokens")
    plt.show()


def memory_widget():
    """Dropdowns over :func:`show_memory_explorer`; each change runs a measurement."""
    import ipywidgets as w

    style = WIDGET_STYLE
    return w.interactive(
        show_memory_explorer,
        preset=w.Dropdown(options=[p for p in PRESETS if p in _INTERACTIVE], value="tiny", style=style),
        batch_size=w.Dropdown(options=[1, 2, 4, 8, 16, 32], value=8, style=style),
        seq_len=w.Dropdown(options=[16, 32, 64, 128, 256], value=64, style=style),
        precision=w.Dropdown(options=list(predict.ALL_PRECISIONS), value="fp32", style=style),
        optimizer=w.Dropdown(options=list(predict.OPTIMIZERS), value="adam", style=style),
        attention=w.Dropdown(options=["sdpa", "explicit"], value="sdpa", style=style),
        recompute=w.Dropdown(options=list(RECOMPUTE), value="none", style=style),
    )
