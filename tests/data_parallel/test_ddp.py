"""Chapter 2: data parallelism by hand == torch DDP == one process; buckets, bytes, memory."""
from __future__ import annotations

import torch
import torch.distributed as dist
import pytest

from course_lib import check_true, run
from course_lib.data_parallel.by_hand import average_gradients
from course_lib.data_parallel.measure import TOLERANCE, compare_ddp
from course_lib.data_parallel.exercises import check_average_gradients, check_ring_bytes
from course_lib.data_parallel.mistakes import sampler_shards, what_breaks
from course_lib.data_parallel.ddp_internals import (bytes_written, compare_accumulation,
                                                    dp_explorer, expected_bytes, fits_per_world,
                                                    measure_dp)
from course_lib.sharding.measure import memory_vs_world
from course_lib.memory.tracker import measure_step
from course_lib.common.models import get_config, param_count

TINY = param_count(get_config("tiny"))
needs_proc_io = pytest.mark.skipif(bytes_written() is None, reason="needs /proc/self/io (Linux)")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_hand_dp_equals_torch_ddp_equals_one_process(world):
    # check=True asserts both against one process (TOLERANCE: fp32 sums in another order, see
    # its comment) and bit-identical parameters on every rank
    result = compare_ddp(world, steps=3, check=True)
    assert result.ranks_spread == 0.0
    assert max(result.hand_vs_single, result.torch_vs_single) <= TOLERANCE["atol"]
    torch.testing.assert_close(result.global_losses, result.single_losses, rtol=1e-5, atol=1e-6)


def test_mistakes_are_caught_and_explained():
    rows = {r.name: r for r in what_breaks(2)}
    assert rows["correct"].vs_global <= TOLERANCE["atol"]
    for name in ("sum, not average", "no communication", "same batch on every rank"):
        assert rows[name].vs_global > 100 * TOLERANCE["atol"], name        # visibly wrong ...
        assert rows[name].vs_equals <= TOLERANCE["atol"], name             # ... and explained
    assert rows["no communication"].ranks_spread > 0                       # replicas drift
    assert rows["sum, not average"].ranks_spread == 0                      # silently wrong


def summed(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def not_yet(model):
    raise NotImplementedError


def divided_only(model):
    for p in model.parameters():
        p.grad /= dist.get_world_size()


def nothing(model):
    pass


def test_gradient_averaging_exercise():
    assert check_true(lambda: check_average_gradients(average_gradients)).passed
    wrong = check_true(lambda: check_average_gradients(summed))
    assert not wrong.passed and "too large" in wrong.message
    assert "Did you divide by the world size?" in wrong.message  # the hint names the mistake
    local = check_true(lambda: check_average_gradients(nothing))
    assert not local.passed and "all_reduce of each param.grad missing" in local.message
    halved = check_true(lambda: check_average_gradients(divided_only))
    assert not halved.passed and "the dist.all_reduce that sums over the ranks is missing" in \
        halved.message, halved.message
    assert "not answered" in check_true(lambda: check_average_gradients(not_yet)).message
    with pytest.raises(TypeError, match="no parentheses"):
        check_average_gradients(None)
    with pytest.raises(ValueError, match="nothing to average"):
        check_average_gradients(average_gradients, world=1)


@needs_proc_io
@pytest.mark.parametrize("world", [2, 4])
def test_bytes_per_step_measured_vs_ring_formula(world):
    reports = measure_dp(world, "tiny", bucket_cap_mb=0.2, timed_steps=2)
    expected = expected_bytes(TINY, world)
    for r in reports:
        assert r.payload_bytes == 4 * TINY == expected["payload"]   # the buckets hold every grad once
        assert len(r.buckets) >= 2                                  # a 0.2 MiB cap splits 0.5 MiB
        # measured socket bytes = ring bytes + gloo's envelope (a few hundred bytes per message)
        assert expected["ring_sent_per_rank"] <= r.sent_bytes <= expected["ring_sent_per_rank"] * 1.02
    assert check_ring_bytes(expected["ring_sent_per_rank"], TINY, world, reports[0].sent_bytes)
    if world > 2:   # at N = 2 the ring sends exactly the payload: 2·(1/2)·4Ψ = 4Ψ
        assert not check_ring_bytes(4 * TINY, TINY, world, reports[0].sent_bytes)  # payload alone
    assert not check_ring_bytes(2 * 4 * TINY, TINY, world)                      # forgot (N-1)/N
    for r in reports:  # the buckets shown and backward's return come from the same step
        assert all(b["ready_ms"] <= b["done_ms"] <= r.backward_ms for b in r.buckets), r


def test_no_sync_accumulation_equals_a_bigger_batch():
    out = compare_accumulation(world=2, micro_steps=4, local_batch=2)
    for key in ("no_sync", "sync_every_micro_batch"):
        assert out[key]["vs_single"] <= TOLERANCE["atol"], key
        assert out[key]["ranks_spread"] == 0.0
    if bytes_written() is not None:   # same result, a quarter of the bytes
        ratio = out["sync_every_micro_batch"]["sent_bytes_per_step"] / out["no_sync"]["sent_bytes_per_step"]
        assert 3.9 < ratio < 4.1


def test_model_states_per_rank_constant_in_world_size_and_equal_to_chapter1():
    per_world = memory_vs_world("tiny", (2, 16), worlds=(1, 4))   # 2: in the notebook
    # chapter 1's instrument on one process (one thread, like every rank here)
    single = run(measure_step, 1, "tiny", (2, 16), threads=1)[0]["model_states"]
    for world, row in per_world.items():
        assert row["model_states"] == row["max_rank_model_states"] == single, world
    fits = fits_per_world({w: r["peak"] for w, r in per_world.items()}, per_world[1]["peak"] - 1)
    assert fits == {1: False, 4: False}                  # more ranks never make it fit


def test_buckets_cost_4_bytes_per_param_unless_grads_are_bucket_views():
    beside = measure_dp(1, "tiny", timed_steps=1)[0]     # DDP keeps buckets even on one rank
    views = measure_dp(1, "tiny", timed_steps=1, gradient_as_bucket_view=True)[0]
    assert beside.alive_after_step - views.alive_after_step == 4 * TINY


def test_widget_function_and_fits():
    reports, expected = dp_explorer(2, "tiny", 2)
    assert [r.rank for r in reports] == [0, 1] and expected["payload"] == 4 * TINY
    assert fits_per_world({1: 10, 2: 10}, 10) == {1: True, 2: True}
    with pytest.raises(ValueError, match="positive number of bytes"):
        fits_per_world({1: 10}, 0)
    with pytest.raises(ValueError, match="preset must be one of"):
        dp_explorer(2, "gpt-7b")


def test_distributed_sampler_shards():
    shards = sampler_shards(12, 3, epoch=0)
    flat = sorted(i for s in shards for i in s)
    assert flat == list(range(12))                       # disjoint and complete
    assert sampler_shards(12, 3, epoch=1) != shards      # set_epoch reshuffles
    assert sum(map(len, sampler_shards(10, 3))) == 12    # padded to divide evenly
    with pytest.raises(ValueError, match="world must be a positive integer"):
        sampler_shards(10, 0)


def test_script_runs_on_real_ranks():
    from course_lib.data_parallel.train_dp import main
    diffs = run(main, 2, ["--mode", "hand", "--steps", "2"])
    assert diffs[0] <= TOLERANCE["atol"]


@pytest.mark.parametrize("call, match", [
    (lambda: compare_ddp(0), "nprocs must be at least 1"),
    (lambda: compare_ddp(2, seq_len=1000), "exceeds preset"),
    (lambda: compare_ddp(2, steps=0), "steps must be a positive integer"),
    (lambda: measure_dp(2, "tiny", bucket_cap_mb=-1), "bucket_cap_mb must be"),
    (lambda: compare_accumulation(2, micro_steps=0), "micro_steps must be"),
    (lambda: what_breaks(1), "world must be an integer >= 2"),
    (lambda: check_ring_bytes(1, 0, 2), "n_params must be"),
])
def test_bad_input_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
