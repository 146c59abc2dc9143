"""Chapter 5's ring in parts: reduce-scatter ownership, bytes on the sockets, the exercise check.

The reduce-scatter half must leave the complete sum of chunk ``r+1`` on rank ``r``; the whole
ring must send ``2(p-1)/p · S`` bytes per rank (measured on the sockets, gloo's envelopes aside);
the exercise check must pass torch's convention and fail each plausible mistake — a deadlock
included, reported after its patience instead of hanging.
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from course_lib.communication import exercises, ring
from course_lib.communication.exercises import check_reduce_scatter
from course_lib.communication.ring import _exchange, ring_reduce_scatter, ring_traffic
from course_lib.launcher.launch import run

SIZES = [2, 3, 5, 1003]


def _owned_chunks(sizes):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for n in sizes:
        data = torch.randn(n, generator=torch.Generator().manual_seed(7 * n + rank))
        total = data.clone()
        dist.all_reduce(total)
        owned = ring_reduce_scatter(data)
        out.append((owned.clone(), total.tensor_split(world)[(rank + 1) % world].clone()))
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_reduce_scatter_leaves_the_sum_of_chunk_r_plus_1_on_rank_r(world):
    for rank_result in run(_owned_chunks, world, SIZES):
        for owned, expected in rank_result:
            torch.testing.assert_close(owned, expected)


def test_each_rank_sends_two_p_minus_one_over_p_of_the_bytes():
    rows = ring_traffic(worlds=(2, 3), size=2**20)
    for row in rows:
        p = row["world"]
        assert row["formula"] == 2 * (p - 1) / p * 2**20
        assert all(row["equal"])
        for sent in row["sent"]:   # the payload plus gloo's small envelope per message
            assert row["formula"] <= sent < 1.01 * row["formula"]


def test_ring_traffic_refuses_bad_requests_before_any_process(monkeypatch):
    monkeypatch.setattr(ring, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match="world size"):
        ring_traffic(worlds=(2, 1))
    with pytest.raises(ValueError, match="at least one"):
        ring_traffic(worlds=())
    with pytest.raises(ValueError, match="positive"):
        ring_traffic(size=0)


def torch_convention(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    chunks = tensor.view(-1).tensor_split(world)
    incoming = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send, recv = (rank - step - 1) % world, (rank - step - 2) % world
        buffer = incoming[:chunks[recv].numel()]
        _exchange(chunks[send], buffer, right, left)
        chunks[recv].add_(buffer)
    return chunks[rank]


def overwrites(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    chunks = tensor.view(-1).tensor_split(world)
    incoming = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send, recv = (rank - step - 1) % world, (rank - step - 2) % world
        buffer = incoming[:chunks[recv].numel()]
        _exchange(chunks[send], buffer, right, left)
        chunks[recv].copy_(buffer)
    return chunks[rank]


def sends_left(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    left = (rank - 1) % world
    chunks = tensor.view(-1).tensor_split(world)
    incoming = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send, recv = (rank - step - 1) % world, (rank - step - 2) % world
        buffer = incoming[:chunks[recv].numel()]
        _exchange(chunks[send], buffer, left, left)
        chunks[recv].add_(buffer)
    return chunks[rank]


def stub(tensor):
    raise NotImplementedError


def test_torch_convention_passes():
    passed, message = check_reduce_scatter(torch_convention)
    assert passed, message


@pytest.mark.parametrize("fn,words", [
    (ring_reduce_scatter, "holds a complete sum, but in chunk 1, not in chunk 0: your chunk indices are shifted"),
    (overwrites, "holds the values of only 1 of the 3 ranks"),
    (lambda tensor: None, "rank 0's chunk 0 holds only its own values"),
], ids=["off-by-one", "overwrites", "nothing"])
def test_each_mistake_fails_and_says_what_is_off(fn, words):
    passed, message = check_reduce_scatter(fn)
    assert not passed
    assert words in message, message


def test_a_deadlock_is_reported_after_the_patience_not_hung():
    start = time.monotonic()
    passed, message = check_reduce_scatter(sends_left, patience=1.0)
    assert not passed and "a deadlock" in message and "after 1 s" in message
    assert time.monotonic() - start < 60


def test_a_stub_raises_on_the_ranks_and_bad_input_fails_before_any_process(monkeypatch):
    from course_lib.launcher.launch import RankError
    with pytest.raises(RankError) as err:
        check_reduce_scatter(stub)
    assert err.value.exc_type == "NotImplementedError"
    monkeypatch.setattr(exercises, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(TypeError, match="pass your function itself"):
        check_reduce_scatter("reduce_scatter")
    with pytest.raises(ValueError, match="world must be an integer >= 3"):
        check_reduce_scatter(torch_convention, world=2)
