"""Chapter 7's code exercises: merging LoRA (on real ranks) and per-tensor int8 vs torch.

Each check passes the solution and fails the plausible mistakes named in the notebook's
``exercise_wrong`` metadata, with a message that says what is off.
"""
from __future__ import annotations

import torch

from course_lib.finetuning.exercises import check_int8_per_tensor, check_merge_lora
from course_lib.finetuning.lora import LoRALinear, merge_lora


def _q(w, *, divide=True, rounding=True, dtype=torch.int8):
    scale = w.abs().max().item() / (127 if divide else 1)
    x = w / scale
    return (torch.round(x) if rounding else x).clamp(-127, 127).to(dtype), scale


def _dq(q, scale):
    return q.to(torch.float32) * scale


def test_int8_per_tensor_solution_passes_and_mistakes_fail():
    passed, message = check_int8_per_tensor(_q, _dq)
    assert passed, message
    cases = [(lambda w: _q(w, divide=False), "127× the right one"),
             (lambda w: _q(w, rounding=False), "always toward zero"),
             (lambda w: _q(w, dtype=torch.uint8), "torch.uint8")]
    for wrong, words in cases:
        passed, message = check_int8_per_tensor(wrong, _dq)
        assert not passed and words in message, message
    passed, message = check_int8_per_tensor(_q, lambda q, s: q.float())
    assert not passed and "dequantized values differ" in message


def test_merge_lora_matches_the_layer_and_leaves_it_unchanged():
    torch.manual_seed(0)
    layer = LoRALinear(torch.nn.Linear(16, 24), r=4, alpha=8)
    with torch.no_grad():
        layer.B.normal_()
    x = torch.randn(3, 16)
    merged = merge_lora(layer)
    torch.testing.assert_close(x @ merged.T + layer.base.bias, layer(x))
    assert not merged.requires_grad and merged.shape == layer.base.weight.shape


def _merge(layer):
    return layer.base.weight.detach() + layer.scale * (layer.B @ layer.A).detach()


def _no_scale(layer):
    return layer.base.weight + layer.B @ layer.A


def _in_place(layer):
    layer.base.weight.data += layer.scale * (layer.B @ layer.A).detach()
    return layer.base.weight


def test_merge_exercise_on_real_ranks(no_leftover_ranks):
    passed, message = check_merge_lora(_merge)
    assert passed, message
    for wrong, words in ((_no_scale, "logits differ"), (_in_place, "changed the frozen base")):
        passed, message = check_merge_lora(wrong)
        assert not passed and words in message, message
