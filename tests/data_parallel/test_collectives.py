"""Chapter 2: the five collectives on real ranks, checked against independently computed results."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from course_lib.data_parallel.collectives import (DEMO_COLLECTIVES, CollectiveDemo,
                                                  format_collectives, show_collectives)
from course_lib.data_parallel.show import plot_collectives


@pytest.fixture(scope="module")
def demos():
    return {d.name: d for d in show_collectives(4)}


def test_broadcast_copies_rank0(demos):
    d = demos["broadcast"]
    assert all(after == d.before[0] for after in d.after)
    assert d.before[1] != d.before[0]          # the ranks really started different


def test_all_reduce_is_the_sum_everywhere(demos):
    d = demos["all_reduce"]
    total = torch.tensor(d.before).sum(0).tolist()
    assert all(after == total for after in d.after)


def test_all_gather_concatenates_in_rank_order(demos):
    d = demos["all_gather"]
    concat = [v for piece in d.before for v in piece]
    assert all(after == concat for after in d.after)


def test_reduce_scatter_gives_rank_r_the_sum_of_piece_r(demos):
    d = demos["reduce_scatter"]
    sums = torch.tensor(d.before).sum(0).tolist()
    assert [after for after in d.after] == [[s] for s in sums]


def test_barrier_nobody_leaves_before_the_last_arrival(demos):
    d = demos["barrier"]
    assert d.left_together
    assert max(b[0] for b in d.before) > 0
    # read from one clock: a rank that left before the last arrival would be caught
    early = CollectiveDemo("barrier", 2, before=[[0.0, 1.0], [0.05, 2.0]], after=[[1.5], [2.0]])
    assert not early.left_together


def test_table_is_deterministic_text(demos):
    text = format_collectives([demos[n] for n in DEMO_COLLECTIVES])
    assert "rank 3: [30, 31, 32, 33]  ->  [60, 64, 68, 72]" in text
    assert "every rank left after the last arrival: True" in text
    with pytest.raises(AttributeError, match="only defined for the barrier"):
        demos["broadcast"].left_together


def test_diagram(demos):
    fig = plot_collectives(list(demos.values()))
    assert len(fig.axes) == 4                  # the barrier moves no data: no panel
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_collectives([demos["barrier"]])


@pytest.mark.parametrize("kwargs, match", [
    ({"world": 1}, "needs partners"),
    ({"world": 99}, "more than this machine allows"),
    ({"names": ("allreduce",)}, "unknown collective"),
])
def test_bad_input_fails_before_any_process(kwargs, match):
    with pytest.raises(ValueError, match=match):
        show_collectives(**kwargs)
