"""Chapter 4's 1F1B exercise, the executor's ``ops=`` and torch's executed order.

The order check must fail each plausible mistake (a warm-up off by one, GPipe's order, no
cool-down, micro-batches that do not exist) with a message that says what is off, before any
process starts; the right order must also run on real ranks. torch's ``Schedule1F1B`` and
``ScheduleGPipe``, run on real ranks, must execute exactly the order ``schedule_ops`` gives.
"""
from __future__ import annotations

import pytest

from course_lib.pipeline_parallel import exercises
from course_lib.pipeline_parallel.exercises import check_1f1b
from course_lib.pipeline_parallel.measure import PP_CONFIG, measure_pipeline, torch_pipeline
from course_lib.pipeline_parallel.schedules import schedule_ops


def one_f_one_b(p, m, rank):
    warmup = min(p - rank - 1, m)
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warmup, m)]


def warmup_too_long(p, m, rank):
    warmup = min(p - rank, m)
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warmup, m)]


def gpipe(p, m, rank):
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def no_cooldown(p, m, rank):
    return one_f_one_b(p, m, rank)[:2 * m - min(p - rank - 1, m)]


def no_min(p, m, rank):
    warmup = p - rank - 1
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warmup, m)]


def backward_first(p, m, rank):   # steady state as "1B1F": one forward fewer in the warm-up
    warmup = min(p - rank - 1, m)
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [("B", i), ("F", warmup + i)]
    return ops + [("B", i) for i in range(m - warmup, m)]


def reversed_order(p, m, rank):
    return one_f_one_b(p, m, rank)[::-1]


def test_the_right_order_passes_and_runs_on_two_ranks():
    passed, message = check_1f1b(one_f_one_b)
    assert passed, message
    assert "stashing [2, 1] micro-batches" in message


@pytest.mark.parametrize("fn,words", [
    (warmup_too_long, "p=4, m=8, rank 0 your schedule runs 1 forward(s) too many before the first backward"),
    (gpipe, "every forward runs before the first backward: that is GPipe's order"),
    (no_cooldown, "p=4, m=8, rank 0 your schedule never runs B5 B6 B7"),
    (no_min, "is not the forward or backward of one of the m=2 micro-batches"),
    (backward_first, "runs 1 forward(s) too few before the first backward"),
    (reversed_order, "B7 runs before the forward of the same micro-batch"),
    (lambda p, m, rank: None, "returned NoneType None"),
], ids=["warmup-off-by-one", "gpipe", "no-cooldown", "no-min", "backward-first", "reversed",
        "none"])
def test_each_mistake_fails_before_any_process_and_says_what_is_off(monkeypatch, fn, words):
    monkeypatch.setattr(exercises, "measure_pipeline", lambda *a, **k: pytest.fail("ran a pipeline"))
    passed, message = check_1f1b(fn)
    assert not passed
    assert words in message, message
    assert "F0 F1 F2" not in message   # the expected order is never printed


def test_not_a_function_is_refused():
    with pytest.raises(TypeError, match="pass your function itself"):
        check_1f1b([("F", 0)])


def test_the_executor_runs_the_order_it_is_given():
    """GPipe's order handed in as ``ops`` while the schedule says 1F1B: it stashes all m."""
    report = measure_pipeline(2, 4, "1f1b", PP_CONFIG, micro_batch=2, steps=1,
                              ops=lambda schedule, p, m, rank: schedule_ops("gpipe", p, m, rank))
    assert [t.stash_peak_count for t in report.traces] == [4, 4]
    with pytest.raises(TypeError, match="ops must be a function"):
        measure_pipeline(2, 4, "1f1b", PP_CONFIG, ops=[("F", 0)])


@pytest.mark.parametrize("schedule,p,m", [("gpipe", 2, 4), ("1f1b", 2, 4), ("1f1b", 4, 8)])
def test_torch_runs_exactly_the_order_of_schedule_ops(schedule, p, m):
    _, _, order = torch_pipeline(p, m, schedule, PP_CONFIG, batch=2 * m, with_order=True)
    assert order == [schedule_ops(schedule, p, m, rank) for rank in range(p)]
