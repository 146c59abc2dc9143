"""Layouts at scale, on paper: per-GPU model-state bytes of a layout for 7B-405B-class models.

The prediction is the rule the small runs of ``run_parallel`` match to the byte — each tensor
split by chapter 4's tensor-parallel plan, then by chapter 3's FSDP formula over ``dp_shard`` —
applied to the course's GPT at the depth and width of large models. Pipeline parallelism gives a
stage ``ceil(n_layer / pp)`` blocks plus the embeddings (first stage) or the final LayerNorm and
``lm_head`` (last stage); the larger of the two is reported. One rule beyond the small runs:
``vocab_parallel`` (default) splits the embedding and output matrices by vocabulary over TP, as
Megatron-LM does. Accounting: fp32 weights, gradients and Adam states, 16 B per parameter (the
course's; the papers' mixed-precision recipes differ in detail).
"""
from __future__ import annotations

import dataclasses

from course_lib.common.models import GPTConfig, param_count
from course_lib.composition.layout import Layout
from course_lib.composition.layouts import KNOWN, predict_pp_bytes
from course_lib.composition.records import Record

__all__ = ["SCALE_PRESETS", "LLAMA3_405B", "LLAMA3_405B_LONG", "AtScale", "at_scale", "scale_table"]

#: the course's GPT (4h GELU MLP, full multi-head attention) at the depth and width of large
#: models: Llama 2 7B/70B and Llama 3 405B have 32/80/126 layers of width 4096/8192/16384
SCALE_PRESETS = {
    "7B": GPTConfig(n_layer=32, n_head=32, d_model=4096, vocab_size=32000, seq_len=4096),
    "70B": GPTConfig(n_layer=80, n_head=64, d_model=8192, vocab_size=32000, seq_len=4096),
    "405B": GPTConfig(n_layer=126, n_head=128, d_model=16384, vocab_size=128256, seq_len=8192),
}

#: Llama 3 405B pre-training on 16,384 H100 GPUs at sequence length 8,192 (Table 4 of
#: "The Llama 3 Herd of Models", 2024): TP 8, CP 1, PP 16, DP 128 (DP is FSDP)
LLAMA3_405B = {"tp": 8, "pp": 16, "dp_shard": 128}
#: its long-context stage, sequence length 131,072, same GPUs (same table): TP 8, CP 16, PP 16, DP 8
LLAMA3_405B_LONG = {"tp": 8, "cp": 16, "pp": 16, "dp_shard": 8}


@dataclasses.dataclass
class AtScale(Record):
    """:func:`at_scale`'s answer: parameters, GPUs, model-state bytes of the fullest GPU."""
    params: int
    gpus: int
    per_gpu_bytes: int


def at_scale(model: str | GPTConfig, layout: Layout | dict, vocab_parallel: bool = True) -> AtScale:
    """Per-GPU model-state bytes of ``model`` under ``layout`` (dims tp, pp, dp_shard,
    dp_replicate, cp). ``dp_replicate`` copies the model states; ``cp`` is counted as copying
    them too (torchtitan instead shards FSDP over dp_shard × cp together)."""
    config = SCALE_PRESETS[model] if isinstance(model, str) else model
    layout = Layout.parse(layout, config, ranks=None, dims=KNOWN)  # any size, no run here
    per_gpu = max(predict_pp_bytes(config, layout, stage, vocab_parallel and layout.tp > 1)
                  ["model_states"] for stage in {0, layout.pp - 1})  # the first, the last stage
    return AtScale(param_count(config), layout.world, per_gpu)


def scale_table(layouts: dict[str, tuple[str, dict[str, int]]]) -> str:
    """One line per ``label: (model, layout)``: parameters, GPUs, model states per GPU."""
    lines = [f"{'':28} {'params':>8} {'GPUs':>6} {'model states/GPU':>17}"]
    for label, (model, layout) in layouts.items():
        r = at_scale(model, layout)
        lines.append(f"{label:28} {r.params / 1e9:7.1f}B {r.gpus:6d} "
                     f"{r.per_gpu_bytes / 2**30:13.1f} GiB")
    return "\n".join(lines)
