"""Chapter 4's tensor-parallel explorer and figure: per-rank bytes against the TP degree.

:func:`tp_explorer` (tests call it) runs the whole GPT tensor-parallel on real ranks and returns
per-rank parameter bytes and bytes all-reduced; :func:`format_tp` prints a row;
:func:`tp_widget` puts a slider in front; :func:`plot_tp_bytes` draws split against replicated.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.common.models import GPTConfig, get_config
from course_lib.display import DPI, FIGSIZE
from course_lib.tensor_parallel.measure import measure_tp_model

__all__ = ["tp_explorer", "format_tp", "tp_widget", "plot_tp_bytes"]

_F, _B = "#4c72b0", "#dd8452"  # the pipeline figures' forward and backward colours


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
                   description="TP degree t")
    out = w.Output()

    def show(_=None) -> None:
        with out:
            out.clear_output(wait=True)
            print(format_tp(tp_explorer(t.value, config)))

    t.observe(show, names="value")
    show()
    return w.VBox([t, out])


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
