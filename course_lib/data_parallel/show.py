"""Chapter 2's figures, tables and widget: collectives, DDP buckets, DP measurements.

Same conventions as :mod:`course_lib.memory.show`: small figures (80 dpi), each function returns the
``Figure``; values drawn are the measured ones passed in, never recomputed here.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.common.models import get_config
from course_lib.data_parallel.collectives import CollectiveDemo
from course_lib.data_parallel.ddp_internals import WIDGET_PRESETS, dp_explorer, fits_per_world
from course_lib.display import COLORS, DPI, FONT_MIN, PALETTE, SUM_COLOR, WIDGET_STYLE, ink
from course_lib.memory.report import format_bytes
from course_lib.common.plots import legible

__all__ = ["plot_collectives", "plot_buckets", "plot_gradient_buckets", "plot_dp_run", "plot_memory_vs_world",
           "format_fits", "show_dp_explorer", "dp_widget"]



def _arrows(demo: CollectiveDemo) -> list[tuple[int, int]]:
    """(from rank, to rank) pairs: who contributes to whose result."""
    n = demo.world
    if demo.name == "broadcast":
        return [(0, r) for r in range(1, n)]
    if demo.name in ("all_reduce", "all_gather", "reduce_scatter"):
        return [(s, r) for s in range(n) for r in range(n) if s != r]
    return []


def _row(ax, x0: float, y: float, values: Sequence[float], colors: Sequence[str]) -> None:
    for i, (v, c) in enumerate(zip(values, colors)):
        ax.add_patch(plt.Rectangle((x0 + i * 0.5, y - 0.35), 0.5, 0.7, color=c, ec="white"))
        ax.text(x0 + i * 0.5 + 0.25, y, f"{v:g}", ha="center", va="center", fontsize=FONT_MIN,
                color=ink(c))


def _origin(value: float) -> str:
    return PALETTE[int(value) // 10 % len(PALETTE)]


@legible
def plot_collectives(demos: Sequence[CollectiveDemo]) -> Figure:
    """One panel per collective: each rank's tensor before (left) and after (right).

    Colours say which rank a value came from; grey cells are sums over all ranks. Lines from a
    rank on the left to a rank on the right mean "sends data that ends up there".
    """
    demos = [d for d in demos if d.name != "barrier"]
    if not demos:
        raise ValueError("nothing to draw: pass the demos of show_collectives (the barrier "
                         "moves no data)")
    cols = min(len(demos), 2)   # two panels a row: at 11 pt a two-digit value needs the width
    rows = -(-len(demos) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.5 * cols, 0.3 + 2.5 * rows), dpi=DPI,
                             squeeze=False)
    for ax in axes.flat[len(demos):]:
        ax.axis("off")
    for ax, demo in zip(axes.flat, demos):
        width_before = max(len(b) for b in demo.before) * 0.5
        x_after = width_before + 1.2
        for rank in range(demo.world):
            y = demo.world - 1 - rank
            _row(ax, 0, y, demo.before[rank], [_origin(v) for v in demo.before[rank]])
            summed = demo.name in ("all_reduce", "reduce_scatter")
            _row(ax, x_after, y, demo.after[rank],
                 [SUM_COLOR if summed else _origin(v) for v in demo.after[rank]])
            ax.text(-0.15, y, f"r{rank}", ha="right", va="center", fontsize=FONT_MIN)
        for src, dst in _arrows(demo):
            ax.annotate("", xy=(x_after - 0.05, demo.world - 1 - dst),
                        xytext=(width_before + 0.05, demo.world - 1 - src),
                        arrowprops={"arrowstyle": "->", "color": PALETTE[src], "lw": 0.7,
                                    "alpha": 0.6})
        width_after = max(len(a) for a in demo.after) * 0.5
        ax.set_xlim(-0.6, x_after + width_after + 0.1)
        ax.set_ylim(-0.6, demo.world - 0.4)
        ax.set_title(demo.name, fontsize=FONT_MIN)
        ax.axis("off")
    fig.suptitle("before → after on each rank (colour: rank the value came from; grey: a sum)",
                 fontsize=FONT_MIN)
    fig.tight_layout()
    return fig


@legible
def plot_buckets(report, title: str = "DDP buckets during backward (rank 0)") -> Figure:
    """Each bucket's all-reduce as a bar from "ready" to "done", against backward's duration."""
    n = len(report.buckets)
    fig, ax = plt.subplots(figsize=(7.0, 1.3 + 0.45 * n), dpi=DPI)
    for i, b in enumerate(report.buckets):
        ax.barh(i, b["done_ms"] - b["ready_ms"], left=b["ready_ms"], color=COLORS["grads"])
    ax.axvline(report.backward_ms, color="black", ls="--", lw=1, label="backward returns")
    labels = [f"bucket {i}: {b['nbytes'] / 2**20:.2f} MiB, {b['n_tensors']} tensors"
              for i, b in enumerate(report.buckets)]
    ax.set_yticks(range(n), labels, fontsize=FONT_MIN)  # beside the axis: no bar hides them
    ax.tick_params(axis="x", labelsize=FONT_MIN)
    ax.invert_yaxis()
    ax.set_xlabel("ms since backward started (bar: ready → all-reduced)", fontsize=FONT_MIN + 1)
    ax.set_title(title, fontsize=FONT_MIN + 2)
    fig.legend(fontsize=FONT_MIN, loc="lower right", frameon=False)
    fig.tight_layout(rect=(0, 0.25 / fig.get_figheight(), 1, 1))
    return fig


@legible
def plot_gradient_buckets(comparison, title: str | None = None) -> Figure:
    """The buckets of a DDP-by-hand run, on every rank: which gradients travel together, when.

    ``comparison`` is what :func:`~course_lib.data_parallel.measure_buckets.compare_by_hand`
    returned (its ``world``, ``buckets`` as (tensors, bytes), ``launches`` as (bucket, gradients
    produced by then) and ``n_grads``). One row per rank; each row is that rank's gradients in
    the order backward produces them, cut into its buckets; each vertical line is one
    all-reduce of one bucket across all ranks, labelled with when it was launched.
    """
    world, buckets = comparison.world, list(comparison.buckets)
    if not buckets:
        raise ValueError("nothing to draw: this comparison recorded no buckets")
    launched = {bucket: produced for bucket, produced in comparison.launches}
    total = sum(nbytes for _, nbytes in buckets) / 2**10
    fig, ax = plt.subplots(figsize=(7.0, 1.9 + 0.5 * world), dpi=DPI)
    left = 0.0
    for i, (n_tensors, nbytes) in enumerate(buckets):
        width = nbytes / 2**10
        for rank in range(world):
            y = world - 1 - rank
            ax.add_patch(plt.Rectangle((left, y - 0.3), width, 0.6, fc=COLORS["grads"],
                                       alpha=1.0 if i % 2 == 0 else 0.6, ec="white", lw=1.5,
                                       gid=f"bucket-{rank}-{i}"))
        x = left + width / 2
        ax.plot([x, x], [-0.3, world - 0.7], color="black", lw=1.2, marker="o", ms=4)
        ax.text(x, world - 0.55, f"bucket {i}\n{n_tensors} tensors", ha="center", va="bottom",
                fontsize=FONT_MIN)
        when = launched.get(i)
        ax.text(x, -0.45, "all-reduce ÷ N" + ("" if when is None else
                                               f"\nafter {when}/{comparison.n_grads} grads"),
                ha="center", va="top", fontsize=FONT_MIN)
        left += width
    ax.set_yticks(range(world), [f"rank {world - 1 - y}" for y in range(world)],
                  fontsize=FONT_MIN)
    ax.set_xlim(-0.01 * total, total * 1.01)
    ax.set_ylim(-1.5, world + 0.3)
    ax.tick_params(axis="x", labelsize=FONT_MIN)
    ax.set_xlabel("KiB of gradients, in the order backward produces them (last layer first)",
                  fontsize=FONT_MIN + 1)
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.set_title(title or f"{world} ranks, buckets of ≥ {comparison.cap_bytes / 2**10:.0f} KiB: "
                 "each bucket is averaged over all ranks at once", fontsize=FONT_MIN + 1)
    fig.tight_layout()
    return fig


@legible
def plot_dp_run(reports: Sequence, expected_sent: float | None = None,
                budget_bytes: float | None = None) -> Figure:
    """Three panels for one measured DDP run: memory per rank, step time, bytes sent per rank."""
    ranks = [r.rank for r in reports]
    fig, axes = plt.subplots(1, 3, figsize=(9.0, 3.4), dpi=DPI)
    mib = 2**20
    axes[0].bar(ranks, [r.model_states / mib for r in reports], color=COLORS["optimizer"],
                label="model states")
    axes[0].bar(ranks, [(r.peak - r.model_states) / mib for r in reports],
                bottom=[r.model_states / mib for r in reports], color=COLORS["activations"],
                label="rest of peak")
    if budget_bytes:
        axes[0].axhline(budget_bytes / mib, color=PALETTE[7], ls=":", lw=1.5, label="device budget")
    axes[0].set_title("peak memory per rank (MiB)", fontsize=FONT_MIN + 1)
    below = dict(fontsize=FONT_MIN, loc="upper center", bbox_to_anchor=(0.5, -0.22),
                 frameon=False)
    axes[0].legend(**below)  # under the panel: a legend inside would hide bars
    axes[1].bar(ranks, [r.step_ms for r in reports], color=COLORS["params"])
    axes[1].set_title("step time per rank (ms)", fontsize=FONT_MIN + 1)
    sent = [(r.sent_bytes or 0) / mib for r in reports]
    axes[2].bar(ranks, sent, color=COLORS["grads"], label="measured (socket writes)")
    if expected_sent is not None:
        axes[2].axhline(expected_sent / mib, color="black", ls="--", lw=1,
                        label="2(N-1)/N · 4Ψ")
    axes[2].set_title("sent per rank per step (MiB)", fontsize=FONT_MIN + 1)
    axes[2].legend(**below)
    for ax in axes:
        ax.set_xlabel("rank", fontsize=FONT_MIN)
        ax.set_xticks(ranks)
        ax.tick_params(labelsize=FONT_MIN)
    fig.tight_layout()
    return fig


@legible
def plot_memory_vs_world(per_world: dict[int, dict[str, int]],
                         title: str = "Per-rank memory under DDP (measured)") -> Figure:
    """Stacked model states per rank for each world size: ``{world: {category: bytes}}``."""
    worlds = sorted(per_world)
    fig, ax = plt.subplots(figsize=(7.0, 3.0), dpi=DPI)
    bottom = [0.0] * len(worlds)
    mib = 2**20
    for key in ("params", "grads", "optimizer"):
        heights = [per_world[w].get(key, 0) / mib for w in worlds]
        ax.bar([str(w) for w in worlds], heights, bottom=bottom, color=COLORS[key], label=key)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("MiB per rank")
    ax.set_title(title, fontsize=FONT_MIN + 1)
    ax.legend(fontsize=FONT_MIN, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def format_fits(per_rank_bytes: Mapping[int, int], budget_bytes: int) -> str:
    """One line per world size: measured bytes per rank, the budget, fits or not."""
    fits = fits_per_world(per_rank_bytes, budget_bytes)
    return "\n".join(f"{world} rank(s): {format_bytes(per_rank_bytes[world])} per rank vs "
                     f"{format_bytes(budget_bytes)} per device -> "
                     f"{'fits' if ok else 'does NOT fit'}" for world, ok in fits.items())


def show_dp_explorer(world: int = 2, preset: str = "tiny", local_batch: int = 4,
                     gpu_memory_mib: float = 0.0) -> None:
    """Print and plot :func:`dp_explorer`; ``gpu_memory_mib`` > 0 draws a per-device budget."""
    try:
        seq_len = min(32, get_config(preset).seq_len)
        reports, expected = dp_explorer(world, preset, local_batch, seq_len)
    except ValueError as err:
        print(f"ValueError: {err}")
        return
    r = reports[0]
    budget = gpu_memory_mib * 2**20 if gpu_memory_mib else None
    print(f"{world} rank(s) × local batch {local_batch} = global batch {world * local_batch}; "
          f"{r.n_params:,} parameters on every rank")
    sent = "n/a" if r.sent_bytes is None else format_bytes(r.sent_bytes)
    print(f"rank 0: peak {format_bytes(r.peak)}, step {r.step_ms:.0f} ms, sent {sent} per step "
          f"(ring formula {format_bytes(expected['ring_sent_per_rank'])})")
    if budget:
        verdict = "fits" if r.peak <= budget else "does NOT fit — more ranks will not help"
        print(f"budget {format_bytes(budget)} per device: {verdict}")
    plot_dp_run(reports, expected["ring_sent_per_rank"], budget)
    plt.show()


def dp_widget():
    """Sliders over :func:`show_dp_explorer`; each change is a real run (about a second)."""
    import ipywidgets as w

    style = WIDGET_STYLE
    return w.interactive(
        show_dp_explorer,
        world=w.IntSlider(value=2, min=1, max=8, description="GPUs (ranks)", style=style,
                          continuous_update=False),
        preset=w.Dropdown(options=list(WIDGET_PRESETS), value="tiny", description="model",
                          style=style),
        local_batch=w.Dropdown(options=[1, 2, 4, 8, 16], value=4, style=style),
        gpu_memory_mib=w.FloatText(value=0.0, description="GPU memory (MiB, 0 = none)",
                                   style=style, continuous_update=False),
    )
