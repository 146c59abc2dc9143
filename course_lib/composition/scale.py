"""Layouts at scale, on paper: per-GPU model-state bytes of a layout for 7B-405B-class models.

The prediction is :func:`course_lib.composition.layouts.predict_gpt_bytes` — the formula the
small runs of ``run_parallel`` match to the byte — applied to the course's GPT at the depth and
width of large models, with pipeline parallelism taking ``ceil(n_layer / pp)`` blocks per stage
(the embeddings and head counted on the same stage: an upper bound by a few percent).
Accounting: fp32 weights, gradients and Adam states, 16 B per parameter (the course's; the
papers' mixed-precision recipes differ in detail).
"""
from __future__ import annotations

import math

from course_lib.common.models import GPTConfig, param_count
from course_lib.composition.layouts import KNOWN, predict_gpt_bytes

__all__ = ["SCALE_PRESETS", "LLAMA3_405B", "at_scale", "scale_table"]

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


def at_scale(model: str | GPTConfig, layout: dict[str, int]) -> dict:
    """Per-GPU model-state bytes of ``model`` under ``layout`` (dims tp, pp, dp_shard,
    dp_replicate, cp; cp and dp_replicate copy the model states, they do not divide them)."""
    config = SCALE_PRESETS[model] if isinstance(model, str) else model
    for name in layout:
        if name not in KNOWN:
            raise ValueError(f"unknown mesh dimension {name!r}; known dimensions: {KNOWN}")
    tp, pp = layout.get("tp", 1), layout.get("pp", 1)
    if config.n_head % tp:
        raise ValueError(f"tp={tp} must divide the {config.n_head} attention heads")
    stage = config.replace(n_layer=math.ceil(config.n_layer / pp))
    dp_layout = {k: v for k, v in layout.items() if k in ("tp", "dp_shard")}
    row = predict_gpt_bytes(stage, dp_layout)
    return {"params": param_count(config), "gpus": math.prod(layout.values()),
            "per_gpu_bytes": row["model_states"]}


def scale_table(layouts: dict[str, tuple[str, dict[str, int]]]) -> str:
    """One line per ``label: (model, layout)``: parameters, GPUs, model states per GPU."""
    lines = [f"{'':28} {'params':>8} {'GPUs':>6} {'model states/GPU':>17}"]
    for label, (model, layout) in layouts.items():
        r = at_scale(model, layout)
        lines.append(f"{label:28} {r['params'] / 1e9:7.1f}B {r['gpus']:6d} "
                     f"{r['per_gpu_bytes'] / 2**30:13.1f} GiB")
    return "\n".join(lines)
