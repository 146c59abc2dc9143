"""Chapter 09's widget: pick a model and a layout, read the per-GPU model states at scale."""
from __future__ import annotations

import math

from course_lib.composition.scale import SCALE_PRESETS, at_scale

__all__ = ["layout_widget", "layout_line"]


def layout_line(model: str, tp: int, pp: int, dp_shard: int, gpu_gb: int = 80) -> str:
    """One layout's GPUs and predicted model states per GPU, against a GPU's memory."""
    layout = {"tp": tp, "pp": pp, "dp_shard": dp_shard}
    try:
        r = at_scale(model, layout)
    except ValueError as err:
        return f"{model}: {err}"
    need = r["per_gpu_bytes"]
    verdict = "fits" if need < gpu_gb * 1e9 else "does not fit"
    return (f"{model}-class GPT ({r['params'] / 1e9:.1f}B parameters) on TP {tp} x PP {pp} x FSDP {dp_shard}"
            f" = {math.prod(layout.values()):,} GPUs: model states {need / 2**30:.1f} GiB per GPU"
            f" — {verdict} in {gpu_gb} GB (activations come on top)")


def layout_widget():
    """Dropdowns over model, tp, pp and dp_shard → :func:`layout_line`."""
    import ipywidgets as widgets

    def show(model: str = "405B", tp: int = 8, pp: int = 16, dp_shard: int = 128) -> None:
        print(layout_line(model, tp, pp, dp_shard))

    one = {"tp": 1, "pp": 1, "dp_shard": 1}
    labels = [(f"{name}-class: {at_scale(name, one)['params'] / 1e9:.1f}B (this course's GPT at that"
               f" model's depth and width)", name) for name in SCALE_PRESETS]
    return widgets.interactive(
        show, model=widgets.Dropdown(options=labels, value="405B",
                                     layout=widgets.Layout(width="max-content")),
        tp=widgets.Dropdown(options=[1, 2, 4, 8], value=8),
        pp=widgets.Dropdown(options=[1, 2, 4, 8, 16], value=16),
        dp_shard=widgets.Dropdown(options=[1, 8, 16, 64, 128], value=128))
