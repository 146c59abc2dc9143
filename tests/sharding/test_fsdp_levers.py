"""FSDP2 with chapter 1's memory levers: activation recomputation (the usual FSDP + AC pairing)
and precision="mixed" (MixedPrecisionPolicy); per-rank bytes measured by FSDPMemTracker against
the shard formulas and chapter 1's activation predictions."""
from __future__ import annotations

import pytest
import torch

from course_lib.common.models import MLP
from course_lib.memory import predict
from course_lib.sharding.formulas import comm_bytes, param_shapes, per_rank_bytes
from course_lib.sharding.measure import measure_distributed

KEYS = ("params", "grads", "optimizer", "model_states", "unsharded_params", "model_states_fwd")


@pytest.fixture(scope="module")
def fsdp_runs():
    return {mode: measure_distributed("tiny", (4, 64), strategy="fsdp", nprocs=2, recompute=mode)
            for mode in ("none", "full")}


def test_fsdp_with_full_recompute_per_rank_bytes_as_predicted(fsdp_runs, no_leftover_ranks):
    expected = per_rank_bytes(param_shapes("tiny"), "fsdp", 2)
    acts = {m: predict.activation_bytes("tiny", 4, 64, "fp32", m) for m in fsdp_runs}
    for mode, reports in fsdp_runs.items():
        for report, formula in zip(reports, expected):
            assert report.info["recompute"] == mode
            assert {k: report[k] for k in KEYS} == {k: formula[k] for k in KEYS}  # states unchanged
            assert report["activations"] == pytest.approx(acts[mode], rel=0.10)
    for none, full in zip(fsdp_runs["none"], fsdp_runs["full"]):  # the saving reaches the peak
        assert full["peak"] < none["peak"]


def test_fake_fsdp_recompute_equals_the_real_run(fsdp_runs):
    fake = measure_distributed("tiny", (4, 64), strategy="fsdp", nprocs=2, recompute="full",
                               fake=True, ranks=[0])[0]
    for key in KEYS + ("activations",):
        assert fake[key] == fsdp_runs["full"][0][key], key


def test_recompute_needs_a_gpt_and_a_known_mode():
    with pytest.raises(ValueError, match="unknown recompute 'some'"):
        measure_distributed("tiny", (4, 64), strategy="fsdp", recompute="some")
    with pytest.raises(ValueError, match="needs the course's GPT"):
        measure_distributed(MLP([4, 2]), (torch.randn(2, 4), torch.randn(2, 2)), strategy="fsdp",
                            recompute="full")


def test_fsdp_mixed_precision_keeps_16_bytes_per_param_sharded(no_leftover_ranks):
    """bf16 gathered for compute, fp32 shards (the master copy), fp32 grads and moments."""
    reports = measure_distributed("tiny", (2, 32), strategy="fsdp", nprocs=2, precision="mixed")
    shapes = param_shapes("tiny")
    for report, formula in zip(reports, per_rank_bytes(shapes, "fsdp", 2, precision="mixed")):
        assert {k: report[k] for k in KEYS} == {k: formula[k] for k in KEYS}
        assert report.info["comm"]["bytes"] == comm_bytes(shapes, "fsdp", 2, "mixed")
    n = reports[0].info["total_params"]  # tiny's dims are even: no padding, shards add up to n
    assert sum(r["params"] + r["grads"] for r in reports) == (4 + 4) * n
    assert sum(r["optimizer"] for r in reports) == 8 * n + 2 * 4 * len(shapes)  # + step counters


def test_mixed_is_refused_for_ddp_with_a_pointer():
    with pytest.raises(ValueError, match="precision='mixed' is offered for .*measure_step"):
        measure_distributed("tiny", (2, 32), strategy="ddp", precision="mixed")
