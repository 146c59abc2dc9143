"""Activation recomputation (chapter 1): measured activations and peak against the predictions,
and gradients identical with and without recomputation."""
import pytest
import torch

import course_lib.memory.tracker as memory
from course_lib.common.models import GPT, MLP, PRESETS
from course_lib.memory import predict
from course_lib.memory.tracker import measure_step

PRESET_BATCHES = [("tiny", (8, 64)), ("small", (4, 128)), ("medium", (1, 256))]


@pytest.mark.parametrize("mode", ["selective", "full"])
@pytest.mark.parametrize("name,batch", PRESET_BATCHES)
def test_recompute_activations_and_peak_as_predicted_on_the_presets(name, batch, mode):
    report = measure_step(name, batch, recompute=mode)
    assert report.info["recompute"] == mode
    assert report["activations"] == pytest.approx(predict.activation_bytes(name, *batch, "fp32", mode), rel=0.10)
    assert report["peak"] == pytest.approx(predict.peak_bytes(name, *batch, "fp32", "adam", mode), rel=0.10)


@pytest.mark.parametrize("precision", ["mixed", "amp"])
def test_full_recompute_with_other_precisions(precision):
    report = measure_step("tiny", (8, 64), precision=precision, recompute="full")
    assert report["activations"] == pytest.approx(predict.activation_bytes("tiny", 8, 64, precision, "full"),
                                                  rel=0.10)
    assert report["peak"] == pytest.approx(predict.peak_bytes("tiny", 8, 64, precision, "adam", "full"), rel=0.10)


def test_full_keeps_one_residual_per_block_and_selective_drops_the_scores():
    """Independent of predict: differences between modes, from the sizes alone."""
    config = PRESETS["tiny"].replace(attention="explicit")
    b, s, h, a, L = 4, 64, config.d_model, config.n_head, config.n_layer
    none, sel, full = (measure_step(config, (b, s), recompute=m)["activations"]
                       for m in ("none", "selective", "full"))
    assert none - sel == L * (4 * b * a * s * s + s * s)   # fp32 softmax + boolean causal mask
    logits_and_head = 4 * b * s * 256 + 2 * 4 * b * s * h + 2 * 4 * b * s + 8 * s + 8
    assert full == L * 4 * b * s * h + logits_and_head       # the blocks' inputs only


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_gradients_identical_with_and_without_recomputation(attention, mode):
    config = PRESETS["tiny"].replace(attention=attention)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (4, 32), generator=g), torch.randint(0, 256, (4, 32), generator=g)
    grads = {}
    for m in ("none", mode):
        torch.manual_seed(0)
        model = GPT(config).set_recompute(m)
        loss = GPT.loss(model(x), y)
        loss.backward()
        grads[m] = (loss.detach(), {k: p.grad for k, p in model.named_parameters()})
    torch.testing.assert_close(grads[mode][0], grads["none"][0], rtol=0, atol=0)
    for k, ref in grads["none"][1].items():
        torch.testing.assert_close(grads[mode][1][k], ref, rtol=1e-6, atol=1e-7, msg=k)


def test_recompute_is_off_by_default_and_in_inference():
    model = GPT(PRESETS["tiny"])
    assert model.recompute == "none" and not model.blocks[0].attn.recompute_core
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(model.set_recompute("full")(x), expected, rtol=0, atol=0)


def test_measure_step_restores_a_modules_recompute_mode():
    model = GPT(PRESETS["tiny"]).set_recompute("selective")
    x = torch.randint(0, 256, (2, 16))
    measure_step(model, (x, x), recompute="full")
    assert model.recompute == "selective" and model.blocks[1].attn.recompute_core


def test_bad_recompute_choices_fail_clearly(monkeypatch):
    with pytest.raises(ValueError, match="recompute must be one of"):
        GPT(PRESETS["tiny"]).set_recompute("half")
    with pytest.raises(ValueError, match="needs the course's GPT"):
        measure_step(MLP([4, 2]), (torch.randn(2, 4), torch.randn(2, 2)), recompute="full")
    monkeypatch.setattr(memory, "GPT", lambda *a, **k: pytest.fail("built a model before the error"))
    with pytest.raises(ValueError, match="unknown recompute 'half'"):
        measure_step("tiny", (2, 16), recompute="half")


def test_tradeoff_rows_carry_measured_and_predicted_bytes_and_plot():
    from matplotlib.figure import Figure
    from course_lib.memory.recompute import time_step, tradeoff
    from course_lib.memory.show import plot_recompute
    rows = tradeoff("tiny", [(2, 16)], modes=("none", "full"), repeats=1)
    assert [r["recompute"] for r in rows] == ["none", "full"]
    for r in rows:
        assert r["activations"] == r["activations_predicted"]
        assert r["forward_s"] > 0 and r["step_s"] > r["forward_s"]
    assert rows[0]["extra_forwards"] == 0.0
    assert isinstance(plot_recompute("tiny", rows, seq_len=16), Figure)
    with pytest.raises(ValueError, match="time_step supports precision"):
        time_step("tiny", (2, 16), precision="amp")
