"""Mixed precision (chapter 1): bf16 weights and grads, fp32 master weights and moments, measured
by torch's tracker against bytes computed from the model's own tensors; and it trains."""
import pytest
import torch

from course_lib.common.models import GPT, MLP, PRESETS
from course_lib.memory import predict
from course_lib.memory.mixed import MixedPrecisionAdam
from course_lib.memory.tracker import measure_step


def tokens(b: int, s: int, vocab: int = 256):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (b, s), generator=g), torch.randint(0, vocab, (b, s), generator=g)


@pytest.mark.parametrize("precision,fp32_grads", [("mixed", 0), ("mixed-fp32-grads", 4)])
@pytest.mark.parametrize("config", [PRESETS["tiny"], PRESETS["tiny"].replace(bias=False, n_layer=1),
                                    PRESETS["tiny"].replace(tie_weights=True), PRESETS["small"]])
def test_mixed_states_are_2_2_12_bytes_per_param_to_the_byte(config, precision, fp32_grads):
    torch.manual_seed(0)
    model = GPT(config, dtype=torch.bfloat16)
    report = measure_step(model, tokens(2, 16), precision=precision)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)           # independent of course_lib.memory.predict
    assert all(p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16 for p in params)
    assert report["params"] == 2 * n
    assert report["grads"] == (2 + fp32_grads) * n
    assert report["optimizer"] == 12 * n + 4 * len(params)  # master + 2 moments, fp32; step counters
    assert report["model_states"] == (16 + fp32_grads) * n + 4 * len(params)
    assert predict.model_state_bytes_for(model, precision) == {k: report[k] for k in
                                                                 ("params", "buffers", "grads",
                                                                  "optimizer", "model_states")}


def test_mixed_on_an_mlp_and_with_adamw():
    model = MLP([16, 32, 4]).to(torch.bfloat16)
    batch = (torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(8, 4))
    report = measure_step(model, batch, precision="mixed", optimizer="adamw")
    n, k = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    assert (report["params"], report["grads"], report["optimizer"]) == (2 * n, 2 * n, 12 * n + 4 * k)


def test_mixed_predictions_of_activations_and_peak_match_a_config_run():
    report = measure_step("tiny", (2, 32), precision="mixed-fp32-grads")
    predicted = predict.predict_step("tiny", 2, 32, "mixed-fp32-grads")
    for key in ("params", "grads", "optimizer", "activations"):
        assert report[key] == predicted[key], key
    assert report["peak"] == pytest.approx(predicted["peak"], rel=0.10)


def test_master_step_is_torch_adam_on_the_fp32_copy():
    """One step equals torch.optim.Adam on an fp32 copy fed the upcast bf16 gradient, exactly."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"], dtype=torch.bfloat16)
    opt = MixedPrecisionAdam(model.parameters(), lr=1e-2)
    reference = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    ref_opt = torch.optim.Adam(reference, lr=1e-2, foreach=False)
    GPT.loss(model(tokens(2, 16)[0]), tokens(2, 16)[1]).backward()
    for r, p in zip(reference, model.parameters()):
        r.grad = p.grad.float()
    opt.step()
    ref_opt.step()
    for r, p in zip(reference, model.parameters()):
        master = opt.state[p]["master"]
        assert master.dtype == torch.float32
        torch.testing.assert_close(master, r.detach(), rtol=0, atol=0)
        torch.testing.assert_close(p, r.detach().to(torch.bfloat16), rtol=0, atol=0)


def test_fp32_buffers_accumulate_each_micro_batch_once():
    torch.manual_seed(0)
    model = MLP([8, 16, 2]).to(torch.bfloat16)
    opt = MixedPrecisionAdam(model.parameters(), fp32_grads=True)
    grads = []
    for i in range(3):
        model.zero_grad(set_to_none=True)
        model(torch.randn(4, 8, dtype=torch.bfloat16)).float().pow(2).mean().backward()
        grads.append([p.grad.float() for p in model.parameters()])
    for buffer, *per_batch in zip(opt.grad_buffers, *grads):
        torch.testing.assert_close(buffer, sum(per_batch))
    opt.step()
    assert all(not b.any() for b in opt.grad_buffers)  # zeroed for the next accumulation


@pytest.mark.parametrize("precision", ["mixed", "mixed-fp32-grads"])
def test_mixed_precision_training_learns(precision):
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"], dtype=torch.bfloat16)
    opt = MixedPrecisionAdam(model.parameters(), lr=3e-3, fp32_grads=precision != "mixed")
    x, y = tokens(4, 32)
    losses = []
    for _ in range(30):
        opt.zero_grad(set_to_none=True)
        loss = GPT.loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    for p in model.parameters():  # the bf16 weight is the rounded master copy
        assert opt.state[p]["master"].dtype == torch.float32
        torch.testing.assert_close(p, opt.state[p]["master"].to(torch.bfloat16), rtol=0, atol=0)


def test_playbook_table_reproduced():
    table = {row["params"]: (row["mixed"], row["mixed-fp32-grads"]) for row in predict.playbook_table()}
    assert table == {1e9: (16, 20), 7e9: (112, 140), 70e9: (1120, 1400), 405e9: (6480, 8100)}
    assert all(row["fp32"] == row["mixed"] for row in predict.playbook_table())


@pytest.mark.parametrize("kwargs,match", [
    (dict(precision="mixed", optimizer="sgd"), "keeps fp32 master weights for Adam"),
    (dict(precision="mixed-fp32", optimizer="adam"), "unknown precision"),
])
def test_mixed_needs_adam(kwargs, match):
    with pytest.raises(ValueError, match=match):
        measure_step("tiny", (2, 16), **kwargs)


def test_mixed_refuses_fp32_modules_and_parameters():
    with pytest.raises(ValueError, match=r"needs torch.bfloat16 parameters .* model.to\(torch.bfloat16\)"):
        measure_step(GPT(PRESETS["tiny"]), tokens(2, 16), precision="mixed")
    with pytest.raises(ValueError, match="needs bf16 or fp16 parameters"):
        MixedPrecisionAdam(MLP([2, 2]).parameters())


def test_fake_7b_mixed_counts_16_bytes_per_param_and_its_peak():
    """The seed's 16 B/param at 7B scale, on fake tensors (about 10 s, nothing allocated)."""
    report = measure_step("gpt-7b", (1, 2048), precision="mixed", fake=True)
    n = report.n_params
    assert (report["params"], report["grads"]) == (2 * n, 2 * n)
    assert report["optimizer"] == 12 * n + 4 * predict.gpt_param_tensors(PRESETS["gpt-7b"])
    assert report["peak"] == predict.peak_bytes("gpt-7b", 1, 2048, "mixed")
