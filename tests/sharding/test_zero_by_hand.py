"""Chapter 3: ShardedOptimizer on the GPT == DDP == torch's ZeRO; its bytes == the formula; the exercise."""
from __future__ import annotations

import pytest
import torch

from course_lib import check_true, run
from course_lib.common.models import get_config, param_count
from course_lib.sharding import formulas as zero
from course_lib.sharding.exercises import SIZES, check_shard_bounds
from course_lib.sharding.strategies import train_rank_sharded
from course_lib.sharding.hand_measure import measure_zero_rank, train_zero_rank
from course_lib.sharding.zero_by_hand import ShardedOptimizer, ZeRO, shard_bounds

# Without biases: attention's key bias has an exactly-zero gradient whose computed value is
# rounding noise, which Adam turns into ±lr steps (see tests/sharding/test_strategies.py).
CONFIG = get_config("tiny").replace(bias=False)
PSI = param_count(CONFIG)
TENSORS = len(zero.param_shapes(CONFIG))


def _all(config):
    out = {s: train_rank_sharded(config, s, steps=3, batch=(4, 32))
           for s in ("ddp", "zero1", "fsdp_no_reshard")}
    for stage in (1, 2):
        out[stage] = train_zero_rank(ShardedOptimizer, stage, config, steps=3, batch=(4, 32))
        out[f"bytes{stage}"] = measure_zero_rank(ShardedOptimizer, stage, config, batch=(4, 32))
    out["old name"] = train_zero_rank(lambda params, cls, stage, lr: ZeRO(_Holder(params), stage, lr),
                                      2, config, steps=1, batch=(4, 32))["losses"]
    return out


class _Holder:
    """Stands for a model: ``ZeRO(model, ...)``, the old signature, reads ``model.parameters()``."""

    def __init__(self, params):
        self.params = list(params)

    def parameters(self):
        return iter(self.params)


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request):
    return run(_all, request.param, CONFIG)


def test_by_hand_trains_like_ddp_and_torchs_zero(ranks, no_leftover_ranks):
    # fp32 Adam: only the order in which the ranks' gradients are summed differs (all-reduce,
    # reduce-scatter, 3 ranks), a few ulps; torch's fp32 defaults hold (see test_strategies.py)
    first = ranks[0]
    for stage, theirs in ((1, "zero1"), (2, "fsdp_no_reshard")):
        for other in ("ddp", theirs):
            torch.testing.assert_close(first[stage]["params"], first[other]["params"])
        for r in ranks:  # every rank holds every updated shard after the all-gather
            torch.testing.assert_close(r[stage]["params"], first[stage]["params"], rtol=0, atol=0)


def test_by_hand_bytes_per_rank_equal_the_flat_formula(ranks):
    world = len(ranks)
    for stage in (1, 2):
        formula = zero.flat_zero_bytes(PSI, stage, world, TENSORS)
        measured = [{k: v for k, v in r[f"bytes{stage}"].items() if k != "peak"} for r in ranks]
        assert measured == formula
    if PSI % world == 0:  # no padding: the paper's staging with fp32 sizes, plus Adam's step
        ideal = zero.ideal_bytes(PSI, world)
        assert ranks[0]["bytes1"]["model_states"] == ideal["zero1"] + 4 * TENSORS
        assert ranks[0]["bytes2"]["model_states"] == ideal["zero2"] + 4 * TENSORS
    assert ranks[0]["old name"] == ranks[0][2]["losses"][:1]  # ZeRO(model, stage, lr) still works


def test_flat_formula_pads_to_equal_shards():
    rows = zero.flat_zero_bytes(10, 2, 4)   # shards of 3: the last rank holds 1 real element
    assert [r["params"] for r in rows] == [48] * 4
    assert [r["grads"] for r in rows] == [12] * 4
    assert [r["optimizer"] for r in rows] == [28, 28, 28, 12]
    assert [r["optimizer"] for r in zero.flat_zero_bytes(10, 2, 4, n_tensors=3)] == [36, 36, 36, 20]
    with pytest.raises(ValueError, match="stage"):
        zero.flat_zero_bytes(10, 3, 4)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_shard_bounds_are_torch_chunks_pieces(numel, world):
    pieces = [len(p) for p in torch.arange(numel).chunk(world)]
    bounds = [shard_bounds(numel, r, world) for r in range(world)]
    assert [b - a for a, b in bounds] == pieces + [0] * (world - len(pieces))
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(bounds[r][1] == bounds[r + 1][0] for r in range(world - 1))


def floor_div(numel, rank, world):
    size = numel // world
    return rank * size, (rank + 1) * size


def remainder_last(numel, rank, world):
    size = numel // world
    return rank * size, numel if rank == world - 1 else (rank + 1) * size


def no_clamp(numel, rank, world):
    size = -(-numel // world)
    return rank * size, (rank + 1) * size


def overlapping(numel, rank, world):
    size = -(-numel // world)
    return min(rank * size, numel), min((rank + 1) * size + 1, numel)


def reversed_ranks(numel, rank, world):
    return shard_bounds(numel, world - 1 - rank, world)


def not_yet(numel, rank, world):
    raise NotImplementedError


@pytest.mark.parametrize("fn,message", [
    (floor_div, "belong to no rank"),
    (remainder_last, "torch.chunk gives it more"),
    (no_clamp, "are not a slice of the buffer"),
    (overlapping, "the shards overlap"),
    (reversed_ranks, "not in rank order"),
    (lambda numel, rank, world: None, "return a tuple of two integers"),
    (not_yet, "not answered yet"),
])
def test_shard_bounds_exercise_fails_each_mistake_with_a_pointer(fn, message):
    feedback = check_true(lambda: check_shard_bounds(fn))
    assert not feedback.passed and message in feedback.message


def test_shard_bounds_exercise_passes_the_solution_and_refuses_bad_arguments():
    assert check_true(lambda: check_shard_bounds(shard_bounds)).passed
    with pytest.raises(TypeError, match="no parentheses"):
        check_shard_bounds(shard_bounds(10, 0, 2))
    with pytest.raises(ValueError, match="world must be"):
        check_shard_bounds(shard_bounds, world=1)


def test_stage_is_checked():
    with pytest.raises(ValueError, match="stage"):
        train_zero_rank(ShardedOptimizer, 3)
    with pytest.raises(ValueError, match="stage"):
        measure_zero_rank(ShardedOptimizer, 0)
