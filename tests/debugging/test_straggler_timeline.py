"""The straggler on the timeline: named by the gathered compute times; on the fast rank the
waiting shows as a collective at least as long as most of the injected delay (real ranks)."""
import pytest

from course_lib.debugging.timeline import straggler_timeline


@pytest.fixture(scope="module")
def seen():
    return straggler_timeline(slow_rank=1, delay=0.15, steps=2)


def test_the_slowed_rank_is_named_and_the_others_wait_in_a_collective(seen):
    assert seen["stragglers"] == [1]
    fast = [s for s in seen["spans"] if s.rank == 0 and s.lane == "comm"]
    slow = [s for s in seen["spans"] if s.rank == 1 and s.lane == "comm"]
    assert len(fast) == len(slow) > 0
    # the slow rank enters each step's first all-reduce >= 0.15 s after its compute began; the
    # fast rank, which entered earlier, cannot leave before the slow one entered
    assert max(s.t1 - s.t0 for s in fast) >= 0.1
    assert max(s.t1 - s.t0 for s in fast) > max(s.t1 - s.t0 for s in slow)


def test_bad_requests_fail_before_any_rank_starts():
    with pytest.raises(ValueError, match="slow_rank"):
        straggler_timeline(slow_rank=2, nprocs=2)
    with pytest.raises(ValueError, match="delay"):
        straggler_timeline(delay=-1)
