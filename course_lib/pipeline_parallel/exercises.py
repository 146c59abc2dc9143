"""Chapter 4's schedule exercise: a learner's 1F1B generator, checked op by op and then run.

:func:`check_1f1b` compares a learner's ``one_f_one_b(p, m, rank)`` with the
exact 1F1B order for every ``p <= 4``, ``m <= 8`` and rank, says what is off without giving the
order away, and — once the order is right — runs it through the chapter's executor
(:func:`~course_lib.pipeline_parallel.schedules.run_schedule`) on 2 real ranks.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from course_lib.pipeline_parallel.measure import PP_CONFIG, dense_reference, measure_pipeline
from course_lib.exercises import Feedback, check_number
from course_lib.pipeline_parallel.formulas import bubble_formula
from course_lib.pipeline_parallel.schedules import schedule_ops

__all__ = ["check_1f1b", "check_bubble_budget"]

#: Every (p, m) checked, the most telling first (p=4, m=8 shows a warm-up off by one or GPipe's order).
GRID = [(p, m) for p in range(4, 0, -1) for m in range(8, 0, -1)]


def _show(ops) -> str:
    return " ".join(f"{k}{i}" for k, i in ops)


def _order_problem(mine: object, p: int, m: int, rank: int) -> str | None:
    """What is wrong with one rank's order, without saying the right one; None if it is right."""
    where = f"for p={p}, m={m}, rank {rank}"
    if not isinstance(mine, (list, tuple)) or not all(
            isinstance(op, (list, tuple)) and len(op) == 2 for op in mine):
        return (f"{where} your function returned {type(mine).__name__} {str(mine)[:60]}; return "
                'a list of ("F", i) and ("B", i) pairs.')
    mine = [(k, i) for k, i in mine]
    expected = schedule_ops("1f1b", p, m, rank)
    if mine == expected:
        return None
    bad = [op for op in mine if op[0] not in ("F", "B") or not isinstance(op[1], int)
           or not 0 <= op[1] < m]
    if bad:
        return f"{where}, {bad[0]} is not the forward or backward of one of the m={m} micro-batches."
    repeated = sorted({op for op in mine if mine.count(op) > 1})
    if repeated:
        return f"{where} your schedule runs {_show(repeated[:3])} more than once."
    missing = [op for op in expected if op not in mine]
    if missing:
        return f"{where} your schedule never runs {_show(missing)}."
    early = [("B", i) for k, i in mine if k == "B" and mine.index(("B", i)) < mine.index(("F", i))]
    if early:
        return f"{where} {_show(early[:1])} runs before the forward of the same micro-batch."
    warm, want = mine.index(("B", 0)), expected.index(("B", 0))
    if warm != want:
        if warm == m and want < m:
            return (f"{where} every forward runs before the first backward: that is GPipe's order, "
                    f"which stashes all {m} micro-batches; 1F1B starts backward earlier.")
        more = "too many" if warm > want else "too few"
        return (f"{where} your schedule runs {abs(warm - want)} forward(s) {more} before the "
                "first backward (the warm-up): count how many micro-batches the stages after "
                "this one must receive before the first gradient can come back.")
    k = next(j for j, (a, b) in enumerate(zip(mine, expected)) if a != b)
    return (f"{where} the warm-up is right, but operation {k} is {_show(mine[k:k + 1])}; after "
            "the warm-up 1F1B alternates one forward and one backward until the forwards run "
            "out, then runs the remaining backwards.")


def _learner_ops(fn: Callable, schedule: str, p: int, m: int, rank: int) -> list:
    """Adapter: the executor asks ``ops(schedule, p, m, rank)``; the learner wrote ``fn(p, m, rank)``."""
    return [(k, i) for k, i in fn(p, m, rank)]


def check_1f1b(fn: Callable[[int, int, int], list], p: int = 2, m: int = 4) -> tuple[bool, str]:
    """Hold ``fn(p, m, rank)`` against the exact 1F1B order; if right, run it on ``p`` real ranks.

    The order is checked for every ``p <= 4``, ``m <= 8`` (``m < p`` included) and rank. The run
    uses the chapter's executor with the learner's order on the small GPT (``PP_CONFIG``):
    its loss and gradients must equal the unsplit model's, and rank ``r`` must stash at most
    ``p - r`` micro-batches. Returns ``(passed, message)`` for :func:`course_lib.check_true`.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself (one_f_one_b, no parentheses), got "
                        f"{type(fn).__name__}")
    for pp, mm in GRID:
        for rank in range(pp):
            problem = _order_problem(fn(pp, mm, rank), pp, mm, rank)
            if problem:
                return False, problem
    report = measure_pipeline(p, m, "1f1b", PP_CONFIG, micro_batch=2, steps=1, grads=True,
                              ops=functools.partial(_learner_ops, fn))
    loss, grads = dense_reference(PP_CONFIG, batch=2 * m)
    mine = {n: g for t in report.traces for n, g in t.grads.items()}
    try:
        torch.testing.assert_close(mine, grads, rtol=1e-4, atol=1e-6)
        same = abs(report.loss - loss) < 1e-5
    except (AssertionError, TypeError):
        same = False
    stash = [t.stash_peak_count for t in report.traces]
    if not same:
        return False, f"the order is right, but on {p} real ranks the gradients differ from the unsplit model's."
    if any(s > p - r for r, s in enumerate(stash)):
        return False, f"the order is right, but the ranks stashed {stash} micro-batches."
    return True, (f"your order is 1F1B's for every p <= 4, m <= 8 and rank; run on {p} real ranks "
                  f"it gives the unsplit model's loss and gradients, stashing {stash} micro-batches.")


def check_bubble_budget(answer, p: int = 4, budget: float = 0.05) -> Feedback:
    """Exercise 5: the fewest equal micro-batches ``m`` that keep ``p`` stages' bubble under ``budget``."""
    m = next(m for m in range(1, 10_000) if bubble_formula(p, m) < budget)
    return check_number(answer, m, name=f"m for a bubble under {budget:.0%}",
                        hint="write the bubble as idle slots over all slots of a step, then solve for m.")
