"""Chapter 5's figures and widget: bus bandwidth, the α-β fit, DDP scaling, the link sweep, what-if,
and two conceptual ones: the ring's messages (:func:`plot_ring_steps`, from
:func:`~course_lib.communication.ring.ring_steps`) and the α-β split (:func:`plot_alpha_beta`).

Figures take the measured rows (never recompute them); :func:`whatif_widget` puts sliders in
front of :func:`course_lib.communication.whatif.whatif_table`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.communication.alphabeta import AlphaBeta
from course_lib.communication.benchmark import CollectiveResult
from course_lib.communication.link_sweep import LinkRow
from course_lib.communication.scaling import ScalingRow
from course_lib.communication.whatif import LINKS, STRATEGIES, whatif_table
from course_lib.display import DPI, FIGSIZE, FONT_MIN, GREY, PALETTE, WIDGET_STYLE, ink
from course_lib.common.plots import legible

__all__ = ["plot_busbw", "plot_fit", "plot_scaling", "plot_link_sweep", "whatif_widget",
           "plot_ring_steps", "plot_alpha_beta"]

_SIZE = dict(figsize=FIGSIZE, dpi=DPI)


@legible
def plot_busbw(rows: Sequence[CollectiveResult], ceiling_gbps: float | None = None) -> Figure:
    """busbw (GB/s) against message size, one line per collective and world size."""
    fig, ax = plt.subplots(**_SIZE)
    for key in dict.fromkeys((r.collective, r.world) for r in rows):
        pts = [r for r in rows if (r.collective, r.world) == key]
        ax.plot([r.size_bytes for r in pts], [r.busbw for r in pts], "o-",
                label=f"{key[0]} ({key[1]} ranks)")
    if ceiling_gbps is not None:
        ax.axhline(ceiling_gbps, color=GREY, ls="--", label="memory copy, 1 process")
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="busbw (GB/s)",
           title="Collectives on this machine")
    ax.legend(fontsize=FONT_MIN, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


@legible
def plot_fit(rows: Sequence[CollectiveResult], fits: Mapping[int, AlphaBeta]) -> Figure:
    """Measured all-reduce times (dots) and the fitted α-β model (lines), per world size."""
    fig, ax = plt.subplots(**_SIZE)
    for world, fit in fits.items():
        pts = sorted((r.size_bytes, r.seconds) for r in rows
                     if r.collective == "all_reduce" and r.world == world)
        sizes = [s for s, _ in pts]
        line, = ax.plot(sizes, [t * 1e3 for _, t in pts], "o", label=f"measured, {world} ranks")
        ax.plot(sizes, [fit.all_reduce(s, world) * 1e3 for s in sizes], "-",
                color=line.get_color(), label=f"fit: {fit}")
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)",
           ylabel="all-reduce time (ms)", title="T = 2(p-1)α + 2(p-1)/p·n·β")
    ax.legend(fontsize=FONT_MIN)
    fig.tight_layout()
    return fig


@legible
def plot_scaling(rows: Sequence[ScalingRow]) -> Figure:
    """Left: strong-scaling step time split into compute and DDP's gradient sync.
    Right: efficiency against ranks for strong and weak scaling (1.0 = ideal)."""
    fig, (left, right) = plt.subplots(1, 2, **_SIZE)
    strong = [r for r in rows if r.mode == "strong"]
    labels = [str(r.world) for r in strong]
    left.bar(labels, [r.compute_s * 1e3 for r in strong], label="compute (no_sync)")
    left.bar(labels, [r.sync_s * 1e3 for r in strong],
             bottom=[r.compute_s * 1e3 for r in strong], label="gradient sync (step − no_sync)")
    left.set(xlabel="ranks", ylabel="step (ms)", title="strong scaling")
    below = dict(fontsize=FONT_MIN, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    left.legend(**below)  # under the panel: inside, it hid the bars
    for mode in ("strong", "weak"):
        pts = [r for r in rows if r.mode == mode]
        right.plot([r.world for r in pts], [r.efficiency for r in pts], "o-", label=mode)
    right.axhline(1.0, color=GREY, ls="--", label="ideal")
    right.set(xlabel="ranks", ylabel="efficiency", title="efficiency", ylim=(0, None))
    right.legend(**below, ncol=3)
    fig.tight_layout()
    return fig


def whatif_widget(params_b: float = 7.0, strategy: str = "ddp", link: str = "NVLink 4 (H100)"):
    """ipywidgets front-end over :func:`whatif_table` (the table lives in ``.children[-1]``)."""
    import ipywidgets as widgets

    size = widgets.FloatLogSlider(value=params_b, base=10, min=-1, max=3, step=0.05,
                                  description="params (B)", style=WIDGET_STYLE)
    strat = widgets.Dropdown(options=sorted(STRATEGIES), value=strategy, description="strategy",
                             style=WIDGET_STYLE)
    net = widgets.Dropdown(options=list(LINKS), value=link, description="link", style=WIDGET_STYLE)
    overlap = widgets.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.05, description="overlap",
                                  style=WIDGET_STYLE)
    tokens = widgets.IntSlider(value=8 * 2048, min=512, max=65536, step=512,
                               description="tokens/GPU", style=WIDGET_STYLE)
    out = widgets.HTML()

    def update(_: object = None) -> None:
        table = whatif_table(size.value * 1e9, strat.value, net.value, overlap=overlap.value,
                             tokens_per_gpu=tokens.value)
        out.value = f"<pre>{table}</pre>"

    for control in (size, strat, net, overlap, tokens):
        control.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox([size, strat, net]), widgets.HBox([overlap, tokens]), out])

_COLORS = {"ddp": PALETTE[0], "fsdp": PALETTE[1]}


@legible
def plot_link_sweep(rows: Sequence[LinkRow], title: str = "") -> Figure:
    """Bars: measured step (ms) per link and strategy; black ticks: the α-β prediction.

    Above the slowest link: how much longer FSDP's step is than DDP's, and its byte ratio.
    """
    links = list(dict.fromkeys(r.link for r in rows))
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(**_SIZE)
    for k, strategy in enumerate(strategies):
        for i, link in enumerate(links):
            row = next((r for r in rows if r.link == link and r.strategy == strategy), None)
            if row is None:
                continue
            x = i + (k - (len(strategies) - 1) / 2) * width
            ax.bar(x, row.step_s * 1e3, width * 0.9, color=_COLORS.get(strategy, GREY),
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
                    fontsize=FONT_MIN)
    ax.set_xticks(range(len(links)), links, fontsize=FONT_MIN)
    ax.set_ylabel("training step (ms)")
    ax.margins(y=0.25)
    ax.set_title(title or "One training step, two nodes, one link", fontsize=FONT_MIN)
    ax.legend(fontsize=FONT_MIN, loc="upper left")
    fig.tight_layout()
    return fig


@legible
def plot_ring_steps(messages: Sequence[Mapping]) -> Figure:
    """One row per rank, one column per step: the chunk the rank sent to its right neighbour
    (colour = chunk) and whose values it carried; the header names the phase the data shows
    (all-gather = every message already holds every rank's sum)."""
    world = 1 + max(m["src"] for m in messages)
    steps = max(m["step"] for m in messages)
    fig, ax = plt.subplots(figsize=(7.0, 1.0 + 0.55 * world), dpi=DPI)
    for m in messages:
        x, y = m["step"] - 1, m["src"]
        colour = PALETTE[(m["chunk"] or 0) % len(PALETTE)]
        ax.add_patch(plt.Rectangle((x + 0.04, y + 0.06), 0.92, 0.88, color=colour, alpha=0.8))
        held = "all" if len(m["ranks"]) == world else "+".join(map(str, m["ranks"]))
        ax.text(x + 0.5, y + 0.5, f"c{m['chunk']} → r{m['dst']}\n{held}", ha="center",
                va="center", fontsize=FONT_MIN, linespacing=1.1,
                color=ink(colour))
    phases: list[list] = []                 # [name, first step, last step]
    for step in range(1, steps + 1):
        full = all(len(m["ranks"]) == world for m in messages if m["step"] == step)
        name = "all-gather" if full else "reduce-scatter"
        if phases and phases[-1][0] == name:
            phases[-1][2] = step
        else:
            phases.append([name, step, step])
    for name, first, last in phases:
        ax.plot([first - 0.96, last - 0.04], [-0.1, -0.1], color="dimgrey", lw=1.5)
        ax.text((first + last) / 2 - 0.5, -0.16, f"{name} ({last - first + 1})", ha="center",
                va="bottom", fontsize=FONT_MIN, color="dimgrey")
    ax.set(xlim=(0, steps), ylim=(world, -0.6))
    ax.set_xticks([s - 0.5 for s in range(1, steps + 1)], [str(s) for s in range(1, steps + 1)],
                  fontsize=FONT_MIN)
    ax.set_yticks([r + 0.5 for r in range(world)], [f"rank {r}" for r in range(world)],
                  fontsize=FONT_MIN)
    ax.set_xlabel(f"step (2(p-1) = {steps} on p = {world} ranks); cell: chunk → receiver, "
                  "and whose values it carries", fontsize=FONT_MIN)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


@legible
def plot_alpha_beta(fits: Mapping[int, AlphaBeta], sizes: Sequence[float] | None = None) -> Figure:
    """The fitted model split into its two terms, per world size: latency 2(p-1)α (flat) and
    bandwidth 2(p-1)/p·n·β (rising); they cross at n = p·α/β, the size where a message stops
    being latency-bound."""
    sizes = list(sizes or [2.0 ** k for k in range(8, 29)])
    fig, ax = plt.subplots(figsize=(7.0, 3.6), dpi=DPI)
    for k, (world, fit) in enumerate(sorted(fits.items())):
        colour = PALETTE[k % len(PALETTE)]
        latency = [2 * (world - 1) * fit.alpha * 1e3] * len(sizes)
        bandwidth = [2 * (world - 1) / world * n * fit.beta * 1e3 for n in sizes]
        ax.plot(sizes, latency, "--", color=colour, label=f"p={world}: 2(p-1)α")
        ax.plot(sizes, bandwidth, ":", color=colour, lw=2, label=f"p={world}: 2(p-1)/p·n·β")
        ax.plot(sizes, [a + b for a, b in zip(latency, bandwidth)], "-", color=colour, lw=2,
                label=f"p={world}: total")
        if fit.beta > 0:
            cross = world * fit.alpha / fit.beta
            ax.axvline(cross, color=colour, lw=1, alpha=0.6)
            ax.annotate(f"p={world}: {cross / 1e6:.2g} MB", (cross, 0.02 + 0.09 * k),
                        xycoords=("data", "axes fraction"), xytext=(4, 0),
                        textcoords="offset points", fontsize=FONT_MIN, color=colour)
    lowest = min(2 * (w - 1) * f.alpha * 1e3 for w, f in fits.items() if w > 1)
    ax.set(xscale="log", yscale="log", ylim=(lowest / 10, None))
    ax.set_xlabel("message size n (bytes); vertical line: n = p·α/β", fontsize=FONT_MIN)
    ax.set_ylabel("all-reduce time (ms)", fontsize=FONT_MIN)
    ax.tick_params(labelsize=FONT_MIN)
    ax.set_title("left of the line latency-bound, right of it bandwidth-bound", fontsize=FONT_MIN)
    ax.legend(fontsize=FONT_MIN, ncol=1, loc="center left", bbox_to_anchor=(1.0, 0.5),
              frameon=False)
    fig.tight_layout()
    return fig
