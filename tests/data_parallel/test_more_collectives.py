"""reduce and all_to_all, shown on request next to chapter 2's five collectives (used by 09)."""
from __future__ import annotations

from course_lib.data_parallel.collectives import (DEMO_COLLECTIVES, MORE_COLLECTIVES,
                                                  format_collectives, show_collectives)


def test_reduce_and_all_to_all_on_four_ranks():
    reduce, a2a = show_collectives(4, names=MORE_COLLECTIVES)
    start = [[10.0 * r + j for j in range(4)] for r in range(4)]
    assert reduce.before == start and a2a.before == start
    assert reduce.after[0] == [sum(10.0 * r + j for r in range(4)) for j in range(4)]
    assert reduce.after[1:] == [[], [], []]
    assert a2a.after == [[10.0 * j + r for j in range(4)] for r in range(4)]  # the transpose
    text = format_collectives([reduce, a2a])
    assert "rank 1: [10, 11, 12, 13]  ->  (not defined: only rank 0 receives)" in text
    assert "rank 1: [10, 11, 12, 13]  ->  [1, 11, 21, 31]" in text
    assert not set(MORE_COLLECTIVES) & set(DEMO_COLLECTIVES)  # chapter 2's default is unchanged
