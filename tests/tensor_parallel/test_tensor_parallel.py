"""Tensor parallelism (chapter 4): hand-written Megatron split and DTensor vs the dense block."""
from __future__ import annotations

import pytest
import torch

from course_lib.common.models import Block, GPTConfig, param_count
from course_lib.tensor_parallel.layers import validate_tp_degree, expected_block_bytes, qkv_rows
from course_lib.tensor_parallel.measure import TP_CONFIG, measure_tp, measure_tp_model
from course_lib.tensor_parallel.show import format_tp, tp_explorer

# fp32 with the sums over heads / hidden units split across ranks and re-added by all-reduce:
# observed differences are ~5e-7 on O(1) outputs and ~3e-9 on gradients of size ~1e-3.
OUT_TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-4, atol=1e-7)


@pytest.fixture(scope="module", params=[("hand", 2), ("hand", 4), ("dtensor", 2), ("dtensor", 4)],
                ids=lambda p: f"{p[0]}-t{p[1]}")
def reports(request):
    impl, t = request.param
    return measure_tp(t, impl)


def test_output_and_input_grad_equal_dense(reports):
    for r in reports:
        torch.testing.assert_close(r.output, r.dense_output, **OUT_TOL)
        torch.testing.assert_close(r.input_grad, r.dense_input_grad, **GRAD_TOL)


def test_gradient_shards_equal_dense_slices(reports):
    for r in reports:
        assert len(r.grads) == 10
        for name, (shard, dense_slice) in r.grads.items():
            torch.testing.assert_close(shard, dense_slice, **GRAD_TOL, msg=lambda m: f"{name}: {m}")


def test_shards_tile_the_dense_qkv():
    config, t = TP_CONFIG, 4
    rows = torch.cat([qkv_rows(config, r, t) for r in range(t)])
    assert sorted(rows.tolist()) == list(range(3 * config.d_model))


def test_parameter_bytes_are_one_over_t(reports):
    dense = Block(TP_CONFIG)
    linear = sum(p.numel() * 4 for n, p in dense.named_parameters()
                 if n.split(".")[1] in ("qkv", "fc") or n.endswith("proj.weight"))
    h = TP_CONFIG.d_model
    replicated = (2 * 2 * h + 2 * h) * 4        # two LayerNorms (weight+bias), two proj biases
    for r in reports:
        assert r.param_bytes == {"split": linear // r.t, "replicated": replicated}


def test_communicated_bytes_two_all_reduces_each_way(reports):
    b, s, h = 2, TP_CONFIG.seq_len, TP_CONFIG.d_model
    for r in reports:
        assert r.comm_calls == {"forward": 2, "backward": 2}
        assert r.comm_bytes == {"forward": 2 * b * s * h * 4, "backward": 2 * b * s * h * 4}
    assert expected_block_bytes(b, s, h)["forward"] == 2 * b * s * h * 4


def test_whole_gpt_matches_dense_and_counts_bytes():
    config = GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16)
    for r in measure_tp_model(2, config, batch=2):
        assert r.max_logit_error < 1e-5
        assert abs(r.loss - r.dense_loss) < 1e-5
        assert r.comm_bytes == {"forward": 2 * 2 * 2 * 16 * 32 * 4, "backward": 2 * 2 * 2 * 16 * 32 * 4}
        assert r.param_bytes["split"] + r.param_bytes["replicated"] < r.dense_param_bytes
        assert r.dense_param_bytes == param_count(config) * 4


def test_tp_explorer_reports_measured_bytes():
    row = tp_explorer(2, GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16))
    assert row["forward_bytes"] + row["backward_bytes"] == row["expected_bytes"]
    assert row["all_reduces"] == 8 and row["loss_matches_dense"]
    assert "t=2" in format_tp(row)


@pytest.mark.parametrize("t, message", [(3, "n_head=4 is not divisible"), (0, "positive integer"),
                                        (2.0, "positive integer")])
def test_bad_degree_fails_before_start(t, message):
    with pytest.raises(ValueError, match=message):
        validate_tp_degree(TP_CONFIG, t)
    with pytest.raises(ValueError, match=message):
        measure_tp(t, "hand", timeout=0.001)   # would time out if any process started


def test_bad_impl_and_batch():
    with pytest.raises(ValueError, match="impl must be one of"):
        measure_tp(2, "megatron", timeout=0.001)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        measure_tp_model(2, batch=0, timeout=0.001)


def test_notebook_exercises():
    from course_lib import check_choice, check_number
    from course_lib.tensor_parallel.layers import tp_plan
    column = [n for n, s in tp_plan().items() if n.startswith("mlp") and s == "column"][0]
    assert not check_choice("mlp.proj", column, ["mlp.fc", "mlp.proj"])
    assert check_choice("mlp.fc", column, ["mlp.fc", "mlp.proj"])
    expected = expected_block_bytes(batch=4, seq=512, d_model=1024)
    total = expected["forward"] + expected["backward"]
    assert check_number(4 * (4 * 512 * 1024) * 4, total)            # the solution
    assert not check_number(2 * (4 * 512 * 1024) * 4, total)        # forward only
    assert not check_number(4 * (4 * 512 * 1024) * 4 // 4, total)  # divided by t
