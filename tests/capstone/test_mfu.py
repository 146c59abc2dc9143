"""torchtitan's MFU: the FLOPs per token counted from a built model's parameters, and the
published Llama 3.1 8B run's MFU from its stored config (checked against transformers' model)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.capstone.mfu import (flops_per_token, gpt_flops_per_token, llama_flops_per_token,
                                     llama_params, mfu, torchtitan_llama_8b)
from course_lib.common.models import GPT, get_config


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_the_gpt_count_is_torchtitans_formula_on_the_built_model(preset):
    c = get_config(preset)
    model = GPT(c)
    params = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for m in model.children() if isinstance(m, nn.Embedding)
                    for p in m.parameters())
    want = 6 * (params - embedding) + 12 * c.n_layer * c.n_head * (c.d_model // c.n_head) * c.seq_len
    assert gpt_flops_per_token(preset) == want


def test_llama_8b_parameters_are_transformers_count():
    transformers = pytest.importorskip("transformers")
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "data" / "models" / "llama-3.1-8b" / "config.json"
    cfg = json.loads(path.read_text())
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    params, embedding = llama_params(cfg)
    assert params == sum(p.numel() for p in model.parameters())
    assert embedding == model.model.embed_tokens.weight.numel()


def test_the_published_8b_run_is_a_third_of_the_h100s_peak():
    run = torchtitan_llama_8b()
    assert run.tokens_per_s_gpu == 5762 and run.peak_flops == 989e12
    assert run.flops_per_token == llama_flops_per_token("llama-3.1-8b", 8192)
    assert 57.8e9 < run.flops_per_token < 58.0e9
    assert 0.335 < run.mfu < 0.339
    assert "Table 1" in run.source


def test_mfu_refuses_a_peak_of_zero():
    assert mfu(flops_per_token(10, 0, 0, 0, 0, 0), 2.0, 60.0) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        mfu(1.0, 1.0, 0.0)
