"""Chapter 1 predictions: the bytes-per-parameter table and the formulas' own consistency.

Measured-vs-predicted comparisons live in ``test_memory.py``.
"""
import pytest
import torch

from course_lib.memory import predict
from course_lib.common.models import GPT, PRESETS


@pytest.mark.parametrize("precision,optimizer,total", [
    ("fp32", "adam", 16), ("fp32", "adamw", 16), ("amp", "adam", 16), ("bf16", "adam", 8),
    ("fp32", "sgd", 8), ("fp32", "sgd-momentum", 12), ("bf16", "sgd", 4), ("bf16", "sgd-momentum", 6),
])
def test_bytes_per_param_table(precision, optimizer, total):
    per = predict.bytes_per_param(precision, optimizer)
    assert per["total"] == per["params"] + per["grads"] + per["optimizer"] == total


def test_rule_of_thumb_is_fp32_adam():
    assert predict.RULE_BYTES_PER_PARAM == predict.bytes_per_param("fp32", "adam")["total"]


@pytest.mark.parametrize("precision,optimizer,match", [
    ("fp16", "adam", "unknown precision 'fp16'"), ("fp32", "lion", "unknown optimizer 'lion'"),
])
def test_unknown_choices_raise(precision, optimizer, match):
    with pytest.raises(ValueError, match=match):
        predict.model_state_bytes(10, precision, optimizer)
    with pytest.raises(ValueError, match=match):
        predict.predict_step("tiny", 2, 8, precision, optimizer)


@pytest.mark.parametrize("bias,tie", [(True, False), (False, False), (False, True)])
def test_config_formula_agrees_with_a_built_module(bias, tie):
    config = PRESETS["small"].replace(bias=bias, tie_weights=tie)
    model = GPT(config)
    assert predict.gpt_param_tensors(config) == len(list(model.parameters()))
    for optimizer in predict.OPTIMIZERS:
        assert predict.model_state_bytes_for(config, "fp32", optimizer) == \
            predict.model_state_bytes_for(model, "fp32", optimizer)


def test_adam_step_counters_are_counted_per_tensor():
    with_steps = predict.model_state_bytes(1000, "fp32", "adam", n_tensors=7)
    assert with_steps["optimizer"] == 8 * 1000 + 4 * 7
    assert predict.model_state_bytes(1000, "fp32", "sgd-momentum", n_tensors=7)["optimizer"] == 4000


def test_inference_is_weights_only():
    assert predict.inference_bytes(1000, "fp32") == 4000
    assert predict.inference_bytes(1000, "bf16") == 2000


def test_korthikanti_minus_ours_is_dropout_masks_and_scores():
    """In 16-bit with stored scores, Korthikanti's 34 sbh + 5 as²b per layer exceeds our blocks by
    the two dropout masks (2 sbh), the dropout mask and output of the attention matrix (3 as²b),
    less our LayerNorm statistics (8 bs, bf16) and boolean causal mask (s²)."""
    c = PRESETS["small"].replace(attention="explicit")
    b, s, h, a, L = 4, 128, c.d_model, c.n_head, c.n_layer
    ours = predict.activation_terms(c, b, s, "bf16")["blocks"]
    expected_gap = L * (2 * s * b * h + 3 * a * s * s * b - 8 * b * s - s * s)
    assert predict.korthikanti_bytes(c, b, s) - ours == expected_gap


def test_activations_grow_linearly_with_sdpa_and_quadratically_with_explicit():
    sdpa = [predict.activation_terms("small", 2, s)["blocks"] for s in (32, 64, 128)]
    assert sdpa[2] - sdpa[1] == 2 * (sdpa[1] - sdpa[0])
    explicit = PRESETS["small"].replace(attention="explicit")
    quad = [predict.activation_terms(explicit, 2, s)["blocks"] for s in (32, 64, 128)]
    assert quad[2] - quad[1] > 2 * (quad[1] - quad[0])


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_the_whole_model_as_one_part_has_the_models_peak(name):
    config = PRESETS[name]
    states = predict.model_state_bytes_for(config)
    for batch in (1, 4):
        assert predict.part_peak_bytes(config, batch, states) == \
            predict.peak_bytes(config, batch, config.seq_len)
    half = predict.part_peak_bytes(config, 4, states, tp=2)  # tp splits what a block saves
    assert half < predict.part_peak_bytes(config, 4, states)


def test_peak_prediction_picks_the_larger_moment():
    small = predict.predict_step("small", 4, 128)
    assert small["peak"] == small["params"] + small["optimizer"] + small["activations"] \
        + small["temporaries"] + small["inputs"]
    big = predict.predict_step("gpt-7b", 1, 128)
    assert big["temporaries"] == 0
    assert big["peak"] == big["params"] + big["grads"] + big["optimizer"] + big["inputs"]
    assert torch.tensor(big["model_states"]) / big["params"] * 4 == pytest.approx(16, rel=1e-6)


@pytest.mark.parametrize("bias,tie", [(True, False), (False, False), (True, True), (False, True)])
def test_root_bytes_are_the_gpt_parameters_outside_its_blocks(bias, tie):
    """Counted on the model itself: the embeddings (first stage), ``ln_f`` and ``lm_head``
    (last stage; ``lm_head`` has no bias; a tied head is the embedding's own tensor)."""
    from dataclasses import replace
    config = replace(PRESETS["tiny"], bias=bias, tie_weights=tie)
    outside = [(n, p.numel()) for n, p in GPT(config).named_parameters()
               if not n.startswith("blocks.")]
    first = sum(k for n, k in outside if n.startswith(("tok_emb", "pos_emb")))
    last = sum(k for n, k in outside if n.startswith(("ln_f", "lm_head")))
    assert predict.root_bytes(config) == 4 * (first + last)
    assert predict.root_bytes(config, 0, 2) == 4 * first
    if not tie:  # a tied head's last stage keeps its own copy of the embedding
        assert predict.root_bytes(config, 1, 2) == 4 * last
