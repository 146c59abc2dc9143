"""Chapter 4's tensor-parallel explorer and figures: per-rank bytes against the TP degree
(:func:`tp_explorer` measures them on real ranks), and one block's split weights."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.common.models import GPTConfig, get_config
from course_lib.display import DPI, FIGSIZE, FONT_MIN, GREY, PALETTE, WIDGET_STYLE
from course_lib.tensor_parallel.layers import qkv_rows, tp_plan
from course_lib.tensor_parallel.measure import TP_CONFIG, measure_tp_model
from course_lib.common.plots import legible

__all__ = ["tp_explorer", "format_tp", "tp_widget", "plot_tp_bytes", "plot_tp_split"]

_F, _B = PALETTE[0], PALETTE[1]  # the pipeline figures' forward and backward colours


def tp_explorer(t: int = 2, config: GPTConfig | str = "small", batch: int = 2) -> dict:
    """Measured per-rank parameter bytes and all-reduced bytes of a ``t``-way TP GPT (rank 0)."""
    config = get_config(config)
    r = measure_tp_model(t, config, batch)[0]
    return {"t": t, "dense_param_bytes": r.dense_param_bytes, "split_bytes": r.param_bytes["split"],
            "replicated_bytes": r.param_bytes["replicated"],
            "rank_param_bytes": r.param_bytes["split"] + r.param_bytes["replicated"],
            "forward_bytes": r.comm_bytes["forward"], "backward_bytes": r.comm_bytes["backward"],
            "all_reduces": r.comm_calls["forward"] + r.comm_calls["backward"],
            "expected_bytes": r.expected["forward"] + r.expected["backward"],
            "n_layer": config.n_layer, "loss_matches_dense": abs(r.loss - r.dense_loss) < 1e-4}


def format_tp(row: dict) -> str:
    """A few lines describing one :func:`tp_explorer` result."""
    kib = 2**10
    return (f"t={row['t']}: parameters per rank {row['rank_param_bytes'] / kib:,.0f} KiB "
            f"(split linears {row['split_bytes'] / kib:,.0f} KiB = dense linears / {row['t']}, "
            f"replicated LayerNorms/embeddings/head {row['replicated_bytes'] / kib:,.0f} KiB) "
            f"of {row['dense_param_bytes'] / kib:,.0f} KiB dense\n"
            f"all-reduced per step: forward {row['forward_bytes'] / kib:,.0f} KiB + backward "
            f"{row['backward_bytes'] / kib:,.0f} KiB in {row['all_reduces']} all-reduces "
            f"(expected 4 x b*s*h*4 B x {row['n_layer']} blocks = {row['expected_bytes'] / kib:,.0f} KiB); "
            f"loss equals dense: {row['loss_matches_dense']}")


def tp_widget(config: GPTConfig | str = "small"):
    """A dropdown for the tensor-parallel degree; each change runs the TP GPT on t ranks."""
    import ipywidgets as w

    heads = get_config(config).n_head
    t = w.Dropdown(options=[d for d in (1, 2, 4, 8) if heads % d == 0], value=2,
                   description="TP degree t", style=WIDGET_STYLE)
    out = w.Output()

    def show(_=None) -> None:
        with out:
            out.clear_output(wait=True)
            print(format_tp(tp_explorer(t.value, config)))

    t.observe(show, names="value")
    show()
    return w.VBox([t, out])


@legible
def plot_tp_bytes(degrees: Sequence[int], split: Sequence[int], replicated: Sequence[int],
                  comm: Sequence[int]) -> Figure:
    """Left: parameter bytes per rank (split + replicated) vs t. Right: bytes all-reduced per step."""
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI)
    labels = [str(t) for t in degrees]
    left.bar(labels, [b / 2**20 for b in split], color=_F, label="split linears")
    left.bar(labels, [b / 2**20 for b in replicated], bottom=[b / 2**20 for b in split],
             color=GREY, label="replicated")
    left.set(xlabel="tensor-parallel degree t", ylabel="MiB of parameters per rank")
    left.legend()
    right.bar(labels, [b / 2**20 for b in comm], color=_B)
    right.set(xlabel="tensor-parallel degree t", ylabel="MiB all-reduced per step")
    fig.suptitle("Tensor parallelism: memory shrinks as 1/t, traffic does not", fontsize=FONT_MIN + 1)
    fig.tight_layout()
    return fig


def _runs(index) -> list[tuple[int, int]]:
    """Consecutive runs ``[(start, stop)]`` of a sorted list of indices."""
    out: list[list[int]] = []
    for i in sorted(int(x) for x in index):
        if out and i == out[-1][1]:
            out[-1][1] += 1
        else:
            out.append([i, i + 1])
    return [(a, b) for a, b in out]


def _kept(name: str, style: str, config: GPTConfig, rank: int, t: int) -> list[tuple[int, int]]:
    """The rows (column-parallel) or columns (row-parallel) of ``name`` that rank keeps."""
    if name == "attn.qkv":
        return _runs(qkv_rows(config, rank, t).tolist())
    per = (4 * config.d_model if name.startswith("mlp") else config.d_model) // t
    return [(rank * per, (rank + 1) * per)]


@legible
def plot_tp_split(reports: Sequence, config: GPTConfig = TP_CONFIG) -> Figure:
    """The four split weights of one block as matrices (``out × in``, as ``nn.Linear`` stores
    them), each rank's part coloured: column-parallel layers keep rows, row-parallel ones
    columns; f sits before each column-parallel layer, g after each row-parallel one.

    ``reports`` are one TP run's per-rank reports (:func:`~course_lib.tensor_parallel.measure.measure_tp`):
    every rank's shard shape is read from its gradient shards and must match the split drawn.
    """
    if not reports:
        raise ValueError("nothing to draw: pass measure_tp(t)'s reports, one per rank")
    t, gap = len(reports), 1.4 * config.d_model
    fig, ax = plt.subplots(figsize=(7.6, 3.9), dpi=DPI)
    x = gap * 0.5
    for name, style in tp_plan().items():
        shards = [tuple(r.grads[f"{name}.weight"][0].shape) for r in reports]
        axis = 0 if style == "column" else 1
        full = list(shards[0])
        full[axis] = sum(s[axis] for s in shards)
        rows, cols = full
        for rank, shard in enumerate(shards):
            kept = _kept(name, style, config, rank, t)
            if sum(b - a for a, b in kept) != shard[axis]:
                raise ValueError(f"rank {rank}'s {name} shard is {shard}: not the Megatron split "
                                 f"of a {rows} × {cols} weight over {t} ranks")
            for a, b in kept:
                xy, w, h = ((x, -b), cols, b - a) if axis == 0 else ((x + a, -rows), b - a, rows)
                ax.add_patch(plt.Rectangle(xy, w, h, fc=PALETTE[rank % len(PALETTE)],
                                           ec="white", lw=0.8, gid=f"slice-{name}-{rank}"))
        ax.add_patch(plt.Rectangle((x, -rows), cols, rows, fc="none", ec="black", lw=1.0))
        ax.text(x + cols / 2, 8, f"{name}\n{style}-parallel\n{rows} × {cols}", ha="center",
                va="bottom", fontsize=FONT_MIN)
        each = f"{shards[0][0]} × {shards[0][1]}"
        ax.text(x + cols / 2, -rows - 8, f"each rank\n{each}", ha="center", va="top",
                fontsize=FONT_MIN)
        marker = ("f", x - gap * 0.27) if style == "column" else ("g", x + cols + gap * 0.27)
        ax.add_patch(plt.Circle((marker[1], -config.d_model / 2), gap * 0.16, fc="white", ec="black",
                                lw=1.2, gid=f"{marker[0]}-{name}"))
        ax.text(marker[1], -config.d_model / 2, marker[0], ha="center", va="center",
                fontsize=FONT_MIN + 3, fontweight="bold")
        x += cols + gap
    handles = [plt.Rectangle((0, 0), 1, 1, color=PALETTE[r % len(PALETTE)])
               for r in range(t)]
    ax.legend(handles, [f"rank {r}" for r in range(t)], fontsize=FONT_MIN, ncol=t,
              loc="upper center", bbox_to_anchor=(0.5, 0.0), frameon=False)
    ax.set_xlim(0, x - gap * 0.4)
    top = max(3 * config.d_model, 4 * config.d_model)
    ax.set_ylim(-top - 0.9 * config.d_model, 1.0 * config.d_model)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(f"one block's split weights over t = {t} ranks\nf: identity forward, "
                 "all-reduce backward · g: all-reduce forward, identity backward",
                 fontsize=FONT_MIN + 1)
    fig.tight_layout()
    return fig
