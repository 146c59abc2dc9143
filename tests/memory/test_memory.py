"""Chapter 1 measurements: torch's tracker vs independently computed bytes, and clear errors."""
import pytest
import torch

import course_lib.memory.tracker as memory
from course_lib.memory import predict
from course_lib.exercises import check_number
from course_lib.memory.tracker import measure_inference, measure_step
from course_lib.common.models import GPT, MLP, PRESETS

STATES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd-momentum": 1}


def expected_states(model: torch.nn.Module, optimizer: str) -> dict:
    """Bytes computed from the model's own tensors, without course_lib.memory.predict."""
    params = list(model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params)
    steps = 4 * len(params) if optimizer.startswith("adam") else 0
    return {"params": weight_bytes, "grads": grad_bytes,
            "optimizer": STATES[optimizer] * weight_bytes + steps}


def tokens(b: int, s: int, vocab: int = 256):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (b, s), generator=g), torch.randint(0, vocab, (b, s), generator=g)


@pytest.mark.parametrize("config,precision,optimizer", [
    (PRESETS["tiny"], "fp32", "adam"),
    (PRESETS["tiny"], "fp32", "sgd"),
    (PRESETS["tiny"].replace(bias=False), "fp32", "sgd-momentum"),
    (PRESETS["tiny"].replace(tie_weights=True), "fp32", "adamw"),
    (PRESETS["tiny"], "amp", "adam"),
    (PRESETS["tiny"].replace(n_layer=1), "bf16", "adam"),
    (PRESETS["tiny"].replace(n_layer=1), "bf16", "sgd-momentum"),
])
def test_measured_model_states_equal_computed_bytes(config, precision, optimizer):
    torch.manual_seed(0)
    model = GPT(config, dtype=torch.bfloat16 if precision == "bf16" else None)
    report = measure_step(model, tokens(2, 16), precision=precision, optimizer=optimizer)
    for key, nbytes in expected_states(model, optimizer).items():
        assert report[key] == nbytes, key
    assert report["model_states"] == report["params"] + report["grads"] + report["optimizer"]
    assert report["inputs"] == 2 * 2 * 16 * 8
    assert report.n_params == sum(p.numel() for p in model.parameters())


def test_mlp_with_float_targets_uses_mse_and_counts_exactly():
    model = MLP([16, 32, 4])
    report = measure_step(model, (torch.randn(8, 16), torch.randn(8, 4)), optimizer="adam")
    assert {k: report[k] for k in ("params", "grads", "optimizer")} == expected_states(model, "adam")
    assert report["activations"] > 0


def test_frozen_parameters_get_no_gradient_or_optimizer_bytes():
    """Fine-tuning freezes weights (chapter 7): torch 2.13's MemTracker alone refuses them."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    for p in list(model.blocks[0].parameters()) + [model.lm_head.weight]:
        p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    report = measure_step(model, tokens(2, 16), optimizer="adam")
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    trainable_bytes = sum(4 * p.numel() for p in trainable)
    assert report["params"] == sum(4 * p.numel() for p in model.parameters())  # frozen ones too
    assert report["grads"] == trainable_bytes < report["params"]
    assert report["optimizer"] == 2 * trainable_bytes + 4 * len(trainable)


@pytest.mark.parametrize("name,batch", [("tiny", (8, 64)), ("small", (4, 128)), ("medium", (1, 256))])
def test_activation_prediction_within_10_percent_for_every_preset(name, batch):
    report = measure_step(name, batch)
    predicted = predict.activation_bytes(name, *batch)
    assert report["activations"] == pytest.approx(predicted, rel=0.10)
    assert report["peak"] == pytest.approx(predict.peak_bytes(name, *batch), rel=0.10)


@pytest.mark.parametrize("precision,attention", [("amp", "sdpa"), ("bf16", "explicit"), ("fp32", "explicit")])
def test_activation_prediction_for_other_precisions_and_attention(precision, attention):
    config = PRESETS["tiny"].replace(n_layer=1, attention=attention)
    report = measure_step(config, (2, 32), precision=precision)
    assert report["activations"] == pytest.approx(predict.activation_bytes(config, 2, 32, precision), rel=0.10)


def test_fake_estimate_equals_real_measurement_on_a_small_config():
    real = measure_step("tiny", (4, 32), optimizer="adam")
    fake = measure_step("tiny", (4, 32), optimizer="adam", fake=True)
    for key in ("params", "buffers", "grads", "optimizer", "model_states"):
        assert fake[key] == real[key], key
    assert fake["peak"] == pytest.approx(real["peak"], rel=0.10)
    assert fake.info["fake"] and not real.info["fake"]


def test_timeline_shows_when_each_category_exists():
    report = measure_step("tiny", (2, 16), optimizer="adam")
    phases = dict(report.timeline)
    assert list(phases) == ["start", "1 forward", "1 backward", "1 step", "2 forward", "2 backward", "2 step"]
    assert phases["1 forward"]["optimizer"] == 0 < phases["1 step"]["optimizer"]
    assert phases["2 forward"]["grads"] == 0  # zero_grad(set_to_none=True) freed them
    assert phases["2 forward"]["activations"] == report["activations"] > phases["2 backward"]["activations"]
    assert report["peak"] == sum(report.peak_breakdown.values())


def test_report_is_a_mapping_and_prints_a_table():
    report = measure_step("tiny", (2, 16), optimizer="sgd")
    assert set(report) >= {"params", "grads", "optimizer", "activations", "peak", "buffers", "temporaries"}
    assert dict(report)["params"] == report["params"]
    text = repr(report)
    assert "params" in text and f"{report['params']:,}" in text and "B/param" in text
    assert "predicted" in report.table(predict.predict_step("tiny", 2, 16, "fp32", "sgd"))


def test_inference_holds_weights_and_short_lived_activations():
    model = GPT(PRESETS["tiny"])
    report = measure_inference(model, tokens(2, 16)[0])
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert report["params"] == weights and report["grads"] == report["optimizer"] == 0
    assert weights < report["peak"] < weights + 2 * 2 * 16 * 256 * 4 * 8


@pytest.fixture
def no_model_building(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the error")
    monkeypatch.setattr(memory, "GPT", refuse)


@pytest.mark.parametrize("kwargs,match", [
    (dict(precision="fp16"), "unknown precision 'fp16'"),
    (dict(optimizer="lion"), "unknown optimizer 'lion'"),
    (dict(iterations=1), "iterations must be >= 2"),
])
def test_bad_choices_fail_before_allocating(no_model_building, kwargs, match):
    with pytest.raises(ValueError, match=match):
        measure_step("tiny", (2, 16), **kwargs)


def test_bad_batch_fails_before_allocating(no_model_building):
    with pytest.raises(ValueError, match=r"batch must be \(batch_size, seq_len\)"):
        measure_step("tiny", (2, -16))
    with pytest.raises(ValueError, match="seq_len=65 exceeds the config's seq_len=64"):
        measure_step("tiny", (2, 65))


class OneMiBFree:
    available = 2**20


def test_run_larger_than_free_ram_raises_memory_error(monkeypatch, no_model_building):
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: OneMiBFree())
    with pytest.raises(MemoryError, match=r"needs about .* only 1.00 MiB of RAM is free; use fake=True"):
        measure_step("small", (4, 128))
    with pytest.raises(MemoryError, match=r"needs about .* only 1.00 MiB of RAM is free"):
        measure_inference("small", (4, 128))


def test_module_run_larger_than_free_ram_raises_memory_error(monkeypatch):
    model = GPT(PRESETS["small"])  # 3.3 MiB of weights; grads + Adam states need 10 MiB more
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: OneMiBFree())
    with pytest.raises(MemoryError, match="needs about"):
        measure_step(model, tokens(4, 128))
    assert all(p.grad is None for p in model.parameters())


def test_fake_runs_need_no_free_ram(monkeypatch):
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: OneMiBFree())
    fake = measure_step("medium", (2, 256), fake=True, optimizer="sgd")
    assert fake["params"] == 4 * 4_935_680


def test_module_with_wrong_dtype_or_fake_module_is_refused():
    model = GPT(PRESETS["tiny"])
    with pytest.raises(ValueError, match=r"needs torch.bfloat16 parameters .* call model.to\(torch.bfloat16\)"):
        measure_step(model, tokens(2, 16), precision="bf16")
    with pytest.raises(ValueError, match="fake=True needs a GPTConfig"):
        measure_step(model, tokens(2, 16), fake=True)


def test_exercise_checks_fail_on_wrong_answers_and_pass_on_the_solution():
    """The notebook's two exercises, with the wrong answers learners typically give."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    report = measure_step(model, tokens(8, 64), optimizer="adam")
    n = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    adam = lambda answer: check_number(answer, report["optimizer"], name="adam-state")
    assert not adam(...) and "not answered yet" in adam(...).message
    assert not adam(2 * 4 * n)                                # forgot the step counters
    assert not adam(4 * n)                                    # one moment only
    assert adam(2 * 4 * n + 4 * n_tensors)                    # the solution
    bf16 = measure_step(PRESETS["tiny"], (8, 64), precision="bf16", optimizer="adam")
    total = lambda answer: check_number(answer, bf16["model_states"], name="bf16-states")
    assert not total(16 * n) and "too high" in str(total(16 * n))        # the fp32 rule
    assert total(8 * n + 4 * n_tensors)
