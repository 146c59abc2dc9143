"""Quantization (chapter 7): stored bytes vs formula, reconstruction error within its bound."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.common.data import get_batch
from course_lib.finetuning.footprint import measure_module
from course_lib.finetuning.lora import add_lora
from course_lib.common.models import GPT, get_config
from course_lib.finetuning.quantize import (KINDS, NF4_CODES, QuantLinear, error_bound,
                                            formula_bytes, quantize, quantize_model, stored_bytes)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(96, 64), (33, 50)])   # 33·50 is not a multiple of 64: padding
def test_stored_bytes_match_formula(kind, shape):
    torch.manual_seed(0)
    q = quantize(torch.randn(shape), kind)
    assert stored_bytes(q) == formula_bytes(shape, kind)
    # independent count: int8 one byte per value; 4-bit two values per byte; fp32 scales
    n = shape[0] * shape[1]
    data = n if kind == "int8" else -(-n // 64) * 32
    scales = 4 * (shape[0] if kind == "int8" else -(-n // 64))
    assert stored_bytes(q) == data + scales


@pytest.mark.parametrize("kind", KINDS)
def test_reconstruction_error_within_bound(kind):
    torch.manual_seed(0)
    w = torch.randn(128, 96) * 0.02
    w[3, 5] = 0.5   # an outlier: its row (int8) / block (4-bit) gets a coarse scale
    q = quantize(w, kind)
    err = (q.dequantize() - w).abs()
    assert (err <= error_bound(q) * (1 + 1e-6) + 1e-9).all()
    # typical error relative to the weights' spread: int8 ~0.5 %, 4-bit ~10 % (outlier blocks worse)
    rel = (err.mean() / w.abs().mean()).item()
    assert rel < {"int8": 0.02, "nf4": 0.15, "int4": 0.2}[kind], rel


def test_nf4_codes_and_exact_values():
    assert len(NF4_CODES) == 16 and NF4_CODES[7] == 0.0 and NF4_CODES[0] == -1 and NF4_CODES[-1] == 1
    w = torch.tensor([[1.0, -1.0, 0.0, 0.5] * 16])           # one block of 64, absmax 1
    deq = quantize(w, "nf4").dequantize()
    assert deq[0, :3].tolist() == [1.0, -1.0, 0.0]            # code values survive exactly
    assert abs(deq[0, 3].item() - 0.44070982933044434) < 1e-7  # 0.5 -> nearest code


def test_quant_linear_forward_and_input_gradient():
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    ql = QuantLinear(lin, "int8")
    x = torch.randn(5, 64, requires_grad=True)
    y = ql(x)
    ref_w = ql.dequantize()
    x_ref = x.detach().clone().requires_grad_(True)
    y_ref = nn.functional.linear(x_ref, ref_w, lin.bias.detach())
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert not any(p.requires_grad for p in ql.parameters())


def test_qlora_does_not_keep_dequantized_weights_for_backward():
    torch.manual_seed(0)
    cfg = get_config("tiny")
    batch = get_batch(2, 32, seed=0)
    q = add_lora(quantize_model(GPT(cfg), "nf4"), r=4)
    lora = add_lora(GPT(cfg), r=4)
    # the dequantize-in-backward function saves no weight copy: activations equal plain LoRA's
    assert measure_module(q, batch)["activations"] == measure_module(lora, batch)["activations"]


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown quantization"):
        quantize(torch.randn(4, 4), "fp8")
    with pytest.raises(ValueError, match="2-D floating-point weight"):
        quantize(torch.randn(4), "int8")
    with pytest.raises(ValueError, match="block must be a positive even integer"):
        quantize(torch.randn(4, 4), "nf4", block=3)
    with pytest.raises(TypeError, match="wraps an nn.Linear"):
        QuantLinear(nn.Conv1d(2, 2, 1))
