"""Checks for the planner's exercise: choose a layout from a plan's table."""
from __future__ import annotations

from course_lib.exercises import TODO, Feedback

__all__ = ["check_layout_choice"]


def check_layout_choice(answer: object, plan, tolerance: float = 0.10) -> Feedback:
    """``answer``: a row of ``plan.rows`` (or its label). Passes when it fits and its tokens/s per
    GPU is within ``tolerance`` of the best fitting row's."""
    name = "layout choice"
    if answer is TODO or answer is None:
        return Feedback(False, "not answered yet: pick a row of the plan (plan.rows[i])", name)
    rows = {r.label: r for r in plan.rows}
    row = rows.get(answer) if isinstance(answer, str) else answer
    if row not in plan.rows:
        return Feedback(False, "not a row of this plan: pick one of plan.rows (or its label)", name)
    if not row.fits:
        return Feedback(False, f"{row.label} does not fit: its peak exceeds the GPU's memory", name)
    best = plan.best
    if row.tokens_per_s_gpu < (1 - tolerance) * best.tokens_per_s_gpu:
        return Feedback(False, f"{row.label} fits but is more than {tolerance:.0%} slower than the "
                        "fastest layout that fits: look for less communication on the slow link", name)
    return Feedback(True, f"{row.label}: fits, within {tolerance:.0%} of the fastest layout", name)
