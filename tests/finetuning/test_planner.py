"""The 7B decision (chapter 7): verdicts at the seed's scale, consistent with fake-tensor runs."""
from __future__ import annotations

import pytest

from course_lib.common.models import get_config, param_count
from course_lib.finetuning.planner import measure_method, plan_finetuning

GB = 1e9


@pytest.fixture(scope="module")
def plan_7b():
    return plan_finetuning("gpt-7b", gpu_memory_gb=80, n_gpus=8, seq_len=2048,
                methods=("ddp", "fsdp", "lora", "qlora"))


def test_7b_model_states_are_16_bytes_per_param(plan_7b):
    n = param_count(get_config("gpt-7b"))
    ddp = plan_7b.row("ddp").bytes
    states = ddp["weights"] + ddp["grads"] + ddp["optimizer"]
    # 16 B/param plus Adam's 4-byte step per tensor (32 layers × 12 + 5 tensors)
    assert states == 16 * n + 4 * (32 * 12 + 5)
    assert 105 * GB < states < 115 * GB           # the seed's "~112 GB" (16 B × 7e9)


def test_7b_verdicts(plan_7b):
    assert not plan_7b.row("ddp").fits           # no full fine-tune on one 80 GB GPU's worth
    assert plan_7b.row("ddp").bytes["peak"] > 80 * GB
    assert plan_7b.row("fsdp").fits and plan_7b.row("fsdp").gpus == 8
    for method in ("lora", "qlora"):
        assert plan_7b.row(method).fits and plan_7b.row(method).gpus == 1
    assert plan_7b.row("qlora").bytes["weights"] < plan_7b.row("lora").bytes["weights"] / 2.5
    assert plan_7b.row("lora").bytes["grads"] < plan_7b.row("ddp").bytes["grads"] / 100


def test_one_gpu_full_fine_tune_does_not_fit():
    p = plan_finetuning("gpt-7b", gpu_memory_gb=80, n_gpus=1, methods=("fsdp",))
    assert not p.row("fsdp").fits                 # nothing to shard over: 16 B/param > 80 GB


@pytest.mark.parametrize("method", ["fsdp", "qlora"])
def test_depth_probe_equals_full_depth_measurement(method):
    # probe at 1+2 layers (fsdp: 2+3), compare with a full-depth run one layer deeper than needed
    cfg = get_config("small") if method == "fsdp" else get_config("tiny").replace(n_layer=3)
    row = plan_finetuning(cfg, n_gpus=4, seq_len=64, depth="probe", methods=(method,)).row(method)
    full = measure_method(cfg, method, row.gpus, (1, 64))
    assert row.source.startswith("fake, 2+3 layers" if method == "fsdp" else "fake, 1+2 layers")
    for key in ("weights", "grads", "optimizer", "activations"):
        assert row.bytes[key] == full[key], key   # every block adds the same tensors: exact
    if method != "fsdp":
        assert row.bytes["peak"] == full["peak"]
    else:  # FSDP's peak moment moves with depth: the probe is labelled an upper estimate (4 % here)
        assert full["peak"] <= row.bytes["peak"] <= 1.10 * full["peak"]
        assert "upper estimate" in row.source


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="n_gpus must be a positive integer"):
        plan_finetuning("tiny", n_gpus=0)
    with pytest.raises(ValueError, match="gpu_memory_gb must be a positive number"):
        plan_finetuning("tiny", gpu_memory_gb=-1)
    with pytest.raises(ValueError, match="unknown preset"):
        plan_finetuning("gpt-9000b")
    with pytest.raises(ValueError, match="methods must be a non-empty subset"):
        plan_finetuning("tiny", methods=("pipeline",))
    with pytest.raises(ValueError, match="unknown assumptions"):
        plan_finetuning("tiny", price=3)
    with pytest.raises(ValueError, match="depth must be"):
        plan_finetuning("tiny", depth="deep")
    with pytest.raises(ValueError, match="recompute must be 'none', 'selective' or 'full'"):
        plan_finetuning("tiny", recompute="some")
    with pytest.raises(ValueError, match="processes must be a positive integer"):
        plan_finetuning("tiny", processes=0)


def test_fake_runs_spread_over_processes_give_the_same_table():
    # two ranks of course_lib.run share the probes; fake runs are deterministic: equal to the byte
    cfg, methods = get_config("tiny").replace(n_layer=5), ("fsdp_no_reshard", "qlora")
    cache = {}
    split = plan_finetuning(cfg, n_gpus=4, seq_len=64, methods=methods, processes=2, cache=cache)
    here = plan_finetuning(cfg, n_gpus=4, seq_len=64, methods=methods, processes=1)
    assert [(r.method, r.bytes, r.source) for r in split.rows] == \
        [(r.method, r.bytes, r.source) for r in here.rows]
    assert len(cache) == 4                             # 2 methods × 2 probe depths, each run once


def test_full_recomputation_makes_a_7b_fsdp_plan_fit_and_costs_a_third_more_compute():
    cache = {}
    stored = plan_finetuning("gpt-7b", micro_batch=8, methods=("fsdp", "lora"), cache=cache)
    recomputed = plan_finetuning("gpt-7b", micro_batch=8, methods=("fsdp", "lora"), cache=cache,
                      recompute="full")
    before, after = stored.row("fsdp"), recomputed.row("fsdp")
    assert not before.fits and after.fits               # 8 sequences of 2048 tokens per GPU
    assert after.bytes["activations"] < before.bytes["activations"] / 5
    for key in ("weights", "grads", "optimizer"):      # model states do not change
        assert after.bytes[key] == before.bytes[key]
    assert after.gpu_hours == pytest.approx(before.gpu_hours * 8 / 6)
    assert "recompute=full" in after.source
    assert recomputed.row("lora").bytes == stored.row("lora").bytes   # adapters: not applied


def test_exercise_checks_fail_on_wrong_and_pass_on_solution():
    from course_lib.finetuning.exercises import check_13b_zero2, check_capstone, check_lora_params

    assert not check_lora_params(...) and not check_lora_params(36864 * 2)
    assert check_lora_params(36864)
    assert not check_13b_zero2("yes") and check_13b_zero2("no")
    assert not check_capstone(5) and check_capstone(6)
