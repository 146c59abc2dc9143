"""LoRA (chapter 7): hand-written adapters vs the merged dense reference; measured model states."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.common.data import get_batch
from course_lib.finetuning.footprint import measure_finetune, measure_module
from course_lib.finetuning.lora import (LoRALinear, add_lora, lora_layers, lora_param_count,
                                        lora_state_bytes, merged_reference_check,
                                        trainable_parameters)
from course_lib.common.models import GPT, get_config, param_count
from course_lib.finetuning.quantize import QuantLinear


def _layer(base: nn.Module, r: int = 4) -> LoRALinear:
    torch.manual_seed(0)
    layer = LoRALinear(base, r=r, alpha=2.0 * r)
    with torch.no_grad():   # B starts at zero, which would make grad_A trivially zero: randomise it
        layer.B.normal_()
    return layer


@pytest.mark.parametrize("quantized", [False, True])
def test_lora_matches_merged_dense_reference(quantized):
    torch.manual_seed(1)
    base = nn.Linear(48, 80)
    layer = _layer(QuantLinear(base, "nf4") if quantized else base)
    x = torch.randn(3, 7, 48, dtype=torch.float64).float()
    diffs = merged_reference_check(layer, x)
    # fp32 sums over 48 (forward) and 21 rows (gradients): a few ulps of values of size ~10-100
    assert diffs["forward"] < 1e-4 and diffs["grad_B"] < 1e-4 and diffs["grad_A"] < 1e-3, diffs
    # and the analytic gradients: dL/dB = s·Gᵀ(xAᵀ), dL/dA = s·(GB)ᵀx with G = upstream gradient
    layer.A.grad = layer.B.grad = None
    y = layer(x)
    g = torch.randn(y.shape)
    (y * g).sum().backward()
    xf, gf = x.reshape(-1, 48), g.reshape(-1, 80)
    torch.testing.assert_close(layer.B.grad, layer.scale * gf.T @ (xf @ layer.A.T), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer.A.grad, layer.scale * (gf @ layer.B).T @ xf, rtol=1e-4, atol=1e-4)


def test_fresh_adapter_is_the_base_model():
    torch.manual_seed(0)
    model = GPT(get_config("tiny"))
    x, _ = get_batch(2, 32, seed=0)
    before = model(x)
    add_lora(model, r=4)
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # B = 0: exactly the same


def test_trainable_count_matches_formula_and_base_is_frozen():
    model = add_lora(GPT(get_config("small")), r=8, targets=("attn.qkv", "mlp.fc"))
    expected = lora_param_count("small", 8, ("attn.qkv", "mlp.fc"))
    assert trainable_parameters(model) == expected == 4 * 8 * ((128 + 384) + (128 + 512))
    assert len(lora_layers(model)) == 8
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert frozen == param_count(get_config("small"))


def test_lora_model_states_measured_equal_formula():
    torch.manual_seed(0)
    model = add_lora(GPT(get_config("tiny")), r=8)
    report = measure_module(model, get_batch(4, 64, seed=0))
    n_adapter = lora_param_count("tiny", 8)
    frozen_bytes = 4 * param_count(get_config("tiny"))
    want = lora_state_bytes(frozen_bytes, n_adapter, n_adapter_tensors=2 * 4 * 2)
    for key in ("params", "grads", "optimizer", "model_states"):
        assert report[key] == want[key], key


def test_lora_shrinks_grads_and_optimizer_not_activations():
    full = measure_finetune("tiny", (4, 64), "full", fake=True)
    lora = measure_finetune("tiny", (4, 64), "lora", r=8, fake=True)
    assert lora["grads"] == 4 * lora.info["trainable"] < full["grads"] / 8
    assert lora["activations"] > 0.5 * full["activations"]   # bf16 base: same tensors, some 2 B


def test_fake_measurement_equals_real():
    real = measure_finetune("tiny", (2, 32), "qlora", fake=False)
    fake = measure_finetune("tiny", (2, 32), "qlora", fake=True)
    for key in ("params", "buffers", "grads", "optimizer", "activations", "peak"):
        assert real[key] == fake[key], key


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="rank r must be a positive integer"):
        LoRALinear(nn.Linear(4, 4), r=0)
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        LoRALinear(nn.Linear(4, 4), r=2, alpha=-1)
    with pytest.raises(ValueError, match="targets must be a non-empty subset"):
        add_lora(GPT(get_config("tiny")), targets=("attn.q",))
    with pytest.raises(TypeError, match="expects a course GPT"):
        add_lora(nn.Linear(4, 4))
    model = add_lora(GPT(get_config("tiny")))
    with pytest.raises(ValueError, match="already has a LoRA adapter"):
        add_lora(model)
    with pytest.raises(ValueError, match="no trainable parameters"):
        measure_module(GPT(get_config("tiny")).requires_grad_(False), get_batch(1, 8, seed=0))
    with pytest.raises(ValueError, match="unknown fine-tuning method"):
        measure_finetune("tiny", (1, 8), "prefix")


def test_compare_finetuning_rows_and_threads_restored():
    from course_lib.finetuning.quality import compare_finetuning

    before = torch.get_num_threads()
    rows = compare_finetuning("tiny", pretrain_steps=2, finetune_steps=1, r=8, threads=1)
    assert torch.get_num_threads() == before, "the caller's thread setting is restored"
    assert [r.method for r in rows] == ["base (no FT)", "full", "lora", "qlora"]
    assert [r.trainable for r in rows] == [0, param_count(get_config("tiny")),
                                           lora_param_count("tiny", 8), lora_param_count("tiny", 8)]
    assert all(r.sums_loss > 0 and r.sentences_loss > 0 for r in rows)


def test_quality_lab_reads_two_kinds_of_lines_not_the_course_corpus():
    """data/corpus.txt is Tiny Shakespeare (no sums); the lab's tasks come from make_corpus."""
    from course_lib.common.data import decode, load_corpus
    from course_lib.finetuning.quality import task_tokens
    assert " + " not in load_corpus()[:100_000]
    sums, sentences = task_tokens("sums"), task_tokens("sentences")
    assert len(sums["train"]) > 10_000 and len(sentences["train"]) > 10_000
    assert all(" + " in line for line in decode(sums["val"]).splitlines()[1:] if line)  # [0]: cut mid-line
    assert not any(" + " in line for line in decode(sentences["val"]).splitlines())
