"""Chapter 7's figures and widget: LoRA's two paths, the fine-tuning methods' memory, the planner.

:func:`plot_lora` reads a LoRA model's own layers (shapes and ``requires_grad``);
:func:`plot_finetune_memory` draws measured reports; :func:`planner_widget` fronts
:func:`course_lib.finetuning.planner.plan_finetuning` (tests call ``plan_finetuning``).

Each widget keeps its own cache of fake-tensor measurements, so a setting seen before answers at
once; a new one costs fake-tensor runs (seconds for the tiny preset, tens of seconds for
``gpt-7b``'s layer slices).
"""
from __future__ import annotations

from typing import Mapping

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from course_lib.display import COLORS, DPI, FONT_MIN, GREY, PALETTE, WIDGET_STYLE
from course_lib.finetuning.planner import plan_finetuning
from course_lib.common.plots import legible

__all__ = ["planner_widget", "plot_lora", "plot_finetune_memory"]

_FROZEN, _TRAINABLE = GREY, PALETTE[2]


def _lora_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's LoRA layers, by shape of the thing (a ``base`` and parameters ``A``, ``B``):
    a notebook cell's own ``LoRALinear`` class counts as much as the library's."""
    return [m for m in model.modules() if hasattr(m, "base")
            and isinstance(getattr(m, "A", None), torch.nn.Parameter)
            and isinstance(getattr(m, "B", None), torch.nn.Parameter)]


def _lora_counts(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """Per wrapped target (``attn.qkv``, …, summed over blocks) and for everything else:
    (frozen, trainable) parameter counts, read from ``requires_grad``."""
    lora = {id(m) for m in _lora_modules(model)}
    wrapped = [name for name, m in model.named_modules() if id(m) in lora]
    counts: dict[str, list[int]] = {}
    for name, p in model.named_parameters():
        owner = next((w for w in wrapped if name.startswith(w + ".")), None)
        key = ".".join(owner.split(".")[-2:]) if owner else "everything else"
        counts.setdefault(key, [0, 0])[p.requires_grad] += p.numel()
    counts["everything else"] = counts.pop("everything else", [0, 0])  # the last bar
    return {k: (v[0], v[1]) for k, v in counts.items()}


@legible
def plot_lora(model: torch.nn.Module) -> Figure:
    """Left: the first LoRA layer, W (frozen) and A, B (trainable) drawn to scale (width = in
    features, height = out or r). Right: frozen and trainable parameters per wrapped target."""
    layers = _lora_modules(model)
    if not layers:
        raise ValueError("the model has no LoRA layer (a module with base, A and B): call add_lora")
    layer = layers[0]
    out_f, in_f, r = layer.out_features, layer.in_features, layer.r
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.0, 3.8), dpi=DPI,
                                      gridspec_kw={"width_ratios": (1, 1.25)})
    gap = 0.25 * in_f
    boxes = {"W": (0.0, 0.0, in_f, out_f, _FROZEN),
             "A": (in_f + gap, out_f - r, in_f, r, _TRAINABLE),
             "B": (2 * in_f + 2 * gap, 0.0, r, out_f, _TRAINABLE)}
    where = {"W": (in_f / 2, -0.04 * out_f, "center", "top"),
             "A": (1.5 * in_f + gap, out_f - r - 0.04 * out_f, "center", "top"),
             "B": (2 * in_f + 2 * gap + r + 0.05 * in_f, out_f / 2, "left", "center")}
    for label, (x, y, w, h, colour) in boxes.items():
        left.add_patch(Rectangle((x, y), w, h, color=colour))
        tensor = layer.base.weight if label == "W" else getattr(layer, label)
        tx, ty, ha, va = where[label]
        left.text(tx, ty, f"{label}\n{tensor.shape[0]}×{tensor.shape[1]}", ha=ha, va=va,
                  fontsize=FONT_MIN)
    left.add_patch(FancyArrowPatch((2 * in_f + gap, out_f - r / 2), (2 * in_f + 2 * gap, out_f - r / 2),
                                   arrowstyle="->", mutation_scale=12))
    left.set(xlim=(-0.05 * in_f, 2.6 * in_f + 2 * gap + r), ylim=(-0.3 * out_f, 1.05 * out_f),
             aspect="equal", xticks=[], yticks=[])
    left.set_title(f"one layer to scale, r = {r}", fontsize=FONT_MIN)
    left.set_xlabel(f"{len(layers)} LoRA layers in the model", fontsize=FONT_MIN)
    left.spines[:].set_visible(False)
    counts = _lora_counts(model)
    names = list(counts)
    for k, (colour, label) in enumerate(((_FROZEN, "frozen"), (_TRAINABLE, "trainable"))):
        values = [counts[n][k] for n in names]
        bars = right.barh([i + (k - 0.5) * 0.4 for i in range(len(names))], values, 0.4,
                          color=colour, label=label)
        right.bar_label(bars, [f"{v:,}" for v in values], fontsize=FONT_MIN, padding=2)
    right.set_yticks(range(len(names)), names, fontsize=FONT_MIN)
    right.invert_yaxis()
    right.set(xscale="log", xlabel="parameters (log scale)")
    right.set_xlim(right=right.get_xlim()[1] * 30)
    trainable = sum(t for _, t in counts.values())
    total = sum(f + t for f, t in counts.values())
    right.set_title(f"trainable {trainable:,} of {total:,} ({100 * trainable / total:.1f} %)",
                    fontsize=FONT_MIN)
    right.legend(fontsize=FONT_MIN, loc="lower right")
    fig.tight_layout()
    return fig


@legible
def plot_finetune_memory(reports: Mapping[str, Mapping]) -> Figure:
    """One stacked bar per method: its measured bytes per category (MB); the marker is its peak."""
    categories = ("params", "buffers", "grads", "optimizer", "activations")
    fig, ax = plt.subplots(figsize=(7.0, 3.5), dpi=DPI)
    methods = list(reports)
    bottoms = [0.0] * len(methods)
    for category in categories:
        heights = [reports[m][category] / 1e6 for m in methods]
        if any(heights):
            ax.bar(methods, heights, 0.6, bottom=bottoms, color=COLORS[category], label=category)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.hlines([reports[m]["peak"] / 1e6 for m in methods], [i - 0.38 for i in range(len(methods))],
              [i + 0.38 for i in range(len(methods))], colors="black", lw=2.5,
              label="peak (measured)")
    ax.set(ylabel="bytes measured (MB)", xlabel="fine-tuning method")
    ax.legend(fontsize=FONT_MIN, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return fig

_MODELS = ("tiny", "small", "medium", "gpt-7b")


def planner_widget(model: str = "tiny", gpu_memory_gb: float = 80, n_gpus: int = 8,
                   seq_len: int = 64, micro_batch: int = 1, r: int = 16,
                   cache: dict | None = None) -> widgets.VBox:
    """Dropdowns for model, GPU memory, GPU count, sequence length, micro-batch and LoRA rank;
    press "Plan" to measure (fake tensors) and print the table. ``cache``: measurements to reuse
    (e.g. the dict an earlier :func:`~course_lib.finetuning.planner.plan_finetuning` call filled)."""
    cache = {} if cache is None else cache
    choices = {"model": (_MODELS, model), "GPU GB": ([16, 24, 40, 48, 80, 141], gpu_memory_gb),
               "GPUs": ([1, 2, 4, 8, 16, 32], n_gpus),
               "seq len": ([64, 128, 256, 512, 1024, 2048, 4096, 8192], seq_len),
               "micro-batch": ([1, 2, 4, 8], micro_batch), "LoRA r": ([4, 8, 16, 64], r)}
    w_model, w_mem, w_gpus, w_seq, w_mb, w_r = (
        widgets.Dropdown(options=options, value=value, description=name, style=WIDGET_STYLE)
        for name, (options, value) in choices.items())
    button = widgets.Button(description="Plan", button_style="primary")
    out = widgets.Output()

    def _run(_=None) -> None:
        out.clear_output()
        with out:
            if w_model.value == "gpt-7b":
                print("measuring 7B slices on fake tensors: ~10-30 s ...")
            try:
                print(plan_finetuning(w_model.value, gpu_memory_gb=w_mem.value,
                                      n_gpus=w_gpus.value, seq_len=w_seq.value,
                                      micro_batch=w_mb.value, r=w_r.value, cache=cache))
            except (ValueError, MemoryError) as err:
                print(f"cannot plan this: {err}")

    button.on_click(_run)
    box = widgets.VBox([widgets.HBox([w_model, w_mem, w_gpus]), widgets.HBox([w_seq, w_mb, w_r]),
                        button, out])
    _run()
    return box

