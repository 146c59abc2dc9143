"""ZeRO formulas (course_lib.zero): the paper's numbers, and the exact per-rank bytes from shapes.

Measurements are compared with these formulas in tests/sharding/test_distributed_memory.py; here the
formulas are checked against independent arithmetic and against torch's own sharding rules.
"""
from __future__ import annotations

import pytest
import torch

from course_lib import zero
from course_lib.common.models import GPT, GPTConfig, param_count

ODD = GPTConfig(n_layer=1, n_head=1, d_model=10, vocab_size=37, seq_len=9)


def test_paper_example_7_5b_on_64_gpus():
    """ZeRO paper, Figure 1: Ψ = 7.5B, N = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB."""
    gb = {k: round(v / 1e9, 1) for k, v in zero.paper_bytes(7.5e9, 64).items()}
    assert gb == {"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "fsdp": 1.9}


def test_paper_formulas_reduce_to_dp_on_one_rank():
    for value in zero.paper_bytes(1000, 1).values():
        assert value == 16 * 1000


def test_ideal_bytes_fp32_adam_is_the_16_byte_rule_divided_in_stages():
    psi, n = 1200, 4
    ideal = zero.ideal_bytes(psi, n)
    assert ideal == {"ddp": 16 * psi, "zero1": 8 * psi + 8 * psi / n,
                     "zero2": 4 * psi + 12 * psi / n, "fsdp": 16 * psi / n}
    assert zero.ideal_bytes(psi, n, "sgd")["fsdp"] == 8 * psi / n


def test_param_shapes_of_a_config_match_the_model():
    shapes = zero.param_shapes(ODD)
    assert shapes == [tuple(p.shape) for p in GPT(ODD).parameters()]
    assert sum(torch.Size(s).numel() for s in shapes) == param_count(ODD)


def test_zero1_assignment_replicates_torch_greedy_partition():
    # Independent check: the greedy rule by hand on four sizes (ties: lowest rank, model order).
    shapes = [(3,), (10,), (10,), (4,)]
    assert zero.zero1_assignment(shapes, 2) == [[1, 3], [2, 0]]
    assert zero.zero1_assignment(shapes, 4) == [[1], [2], [3], [0]]
    # Against ZeroRedundancyOptimizer itself: tests/sharding/test_distributed_memory.py measures the
    # optimizer bytes of every rank and compares them with this assignment.


def test_fsdp_rows_follow_torch_chunk():
    for dim0 in (1, 5, 9, 10, 37):
        for world in (1, 2, 3, 4, 8):
            chunk, rows = zero.fsdp_rows(dim0, world)
            sizes = [len(c) for c in torch.chunk(torch.arange(dim0), world)]
            assert rows == sizes + [0] * (world - len(sizes))
            assert chunk * world >= dim0 and sum(rows) == dim0


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp_no_reshard", "fsdp"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_per_rank_bytes_replicated_per_rank_sharded_parts_sum_to_total(strategy, world):
    shapes = zero.param_shapes(ODD)
    psi, tensors = param_count(ODD), len(shapes)
    rows = zero.per_rank_bytes(shapes, strategy, world)
    states = sum(r["optimizer"] for r in rows)
    if strategy in ("ddp", "zero1"):
        assert all(r["params"] == r["grads"] == 4 * psi for r in rows)
        copies = world if strategy == "ddp" else 1
        assert states == copies * (8 * psi + 4 * tensors)
    else:  # padded shards: the sum over ranks covers the padding, the states only real rows
        assert sum(r["params"] for r in rows) >= 4 * psi
        assert states == 8 * psi + 4 * tensors * world
    if world == 1:
        assert {k: rows[0][k] for k in ("params", "grads", "optimizer")} == \
            {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi + 4 * tensors}


def test_per_rank_bytes_close_to_ideal_for_an_evenly_divisible_model():
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=64)
    shapes, psi = zero.param_shapes(cfg), param_count(cfg)
    for strategy in ("ddp", "fsdp"):
        row = zero.per_rank_bytes(shapes, strategy, 4)[0]
        steps = 4 * len(shapes)
        assert row["model_states"] - steps == zero.ideal_bytes(psi, 4)[strategy]


def test_no_reshard_forward_moment_holds_the_gathered_parameters():
    """fully_shard(reshard_after_forward=False) between forward and backward: full params (2 B in amp) + sharded params + states."""
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=64)
    shapes, psi = zero.param_shapes(cfg), param_count(cfg)
    row = zero.per_rank_bytes(shapes, "fsdp_no_reshard", 4, precision="amp")[0]
    assert row["unsharded_params"] == 2 * psi
    assert row["model_states_fwd"] == 2 * psi + 4 * psi // 4 + 8 * psi // 4 + 4 * len(shapes)


def test_comm_bytes_ratios():
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=64)
    shapes, psi = zero.param_shapes(cfg), param_count(cfg)
    volume = {s: sum(v * (2 if k == "all_reduce" else 1)
                     for k, v in zero.comm_bytes(shapes, s, 4).items()) for s in zero.STAGES}
    assert volume["ddp"] == 2 * 4 * psi and volume["fsdp_no_reshard"] == 2 * 4 * psi
    assert volume["fsdp"] == 3 * 4 * psi and volume["zero1"] == 3 * 4 * psi
    assert zero.paper_comm(psi, "fsdp") / zero.paper_comm(psi, "ddp") == 1.5
    assert zero.comm_bytes(shapes, "fsdp", 1) == {}


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy 'zero4'"):
        zero.per_rank_bytes([(2, 2)], "zero4", 2)


def test_names_in_the_wild_cover_every_strategy():
    assert [row["course"] for row in zero.NAMES_IN_THE_WILD] == list(zero.STAGES)
    assert all(f'"stage": {i}' in row["DeepSpeed"] for i, row in enumerate(zero.NAMES_IN_THE_WILD))
