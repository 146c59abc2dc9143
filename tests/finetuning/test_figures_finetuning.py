"""Chapter 07's figures are drawn from the objects beside them: LoRA models of two ranks and
target sets give different slabs and rows, and the counts read back equal the parameters'
own; the memory figure's stacks are the reports' bytes."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from course_lib.common.models import GPT, get_config
from course_lib.finetuning.lora import add_lora, lora_layers
from course_lib.finetuning.show import plot_finetune_memory, plot_lora
from figure_checks import too_small  # noqa: E402


@pytest.mark.parametrize("r, targets", [(2, ("attn.qkv",)), (16, ("attn.qkv", "mlp.fc", "mlp.proj"))])
def test_lora_figure_reads_the_model(r, targets):
    torch.manual_seed(0)
    model = add_lora(GPT(get_config("tiny")), r=r, targets=targets)
    fig = plot_lora(model)
    assert not too_small(fig)
    left, right = fig.axes
    first = lora_layers(model)[0]
    w, a, b = (p.get_width() * p.get_height() for p in left.patches[:3])
    assert (w, a, b) == (first.base.weight.numel(), first.A.numel(), first.B.numel())
    rows = [t.get_text() for t in right.get_yticklabels()]
    assert rows == list(targets) + ["everything else"]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert right.get_title() == f"trainable {trainable:,} of {total:,} ({100 * trainable / total:.1f} %)"
    bars = [p.get_width() for p in right.patches]
    assert sum(bars) == total


def test_memory_figure_stacks_the_reports():
    reports = {"full": {"params": 4e6, "buffers": 0, "grads": 4e6, "optimizer": 8e6,
                        "activations": 2e6, "peak": 15e6},
               "qlora": {"params": 1e6, "buffers": 5e5, "grads": 2e5, "optimizer": 4e5,
                         "activations": 2e6, "peak": 3e6}}
    fig = plot_finetune_memory(reports)
    assert not too_small(fig)
    ax = fig.axes[0]
    tops = {}
    for bar in ax.patches:
        tops[round(bar.get_x(), 3)] = max(tops.get(round(bar.get_x(), 3), 0), bar.get_y() + bar.get_height())
    assert sorted(tops.values()) == pytest.approx([4.1, 18.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["full", "qlora"]
    assert len(ax.patches) == 5 * 2   # every category some method has, one bar per method
