"""Chapter 11's exercise check: the learner's DiLoCo outer step, on 2 real ranks.

``check_outer_step(outer_step)`` trains the chapter's student with H = 4 inner AdamW steps and
the DiLoCo outer step (SGD, Nesterov momentum 0.9, lr 0.7) twice in one launch: once with the
learner's ``outer_step(model, global_params, outer_opt)``, once with the library's
(:func:`course_lib.communicating_less.local_sgd.outer_step`); after 12 inner steps (3 outer
steps) both ranks' weights must agree with the reference's to float tolerance.
``check_bytes_per_step(answer)``: bytes per inner step each of 4 ranks sends with H = 8.
"""
from __future__ import annotations

import torch

from course_lib.communicating_less.local_sgd import outer_step as reference_outer_step
from course_lib.common.models import mlp_param_count
from course_lib.communicating_less.measure import SIZES, local_sgd_rank
from course_lib.exercises import Feedback, check_number
from course_lib.launcher.launch import run

__all__ = ["check_outer_step", "check_bytes_per_step"]


def _both(outer_step) -> tuple[list, list]:
    mine = local_sgd_rank([4], 12, outer=outer_step)[0]["params"]
    want = local_sgd_rank([4], 12, outer=reference_outer_step)[0]["params"]
    return mine, want


def check_outer_step(outer_step) -> tuple[bool, str]:
    """For ``check_true``: the learner's outer step trains exactly like the library's."""
    per_rank = run(_both, 2, outer_step)
    for rank, (mine, want) in enumerate(per_rank):
        worst = max((m - w).abs().max().item() for m, w in zip(mine, want))
        if worst > 1e-5:
            other = per_rank[1 - rank][0]
            same = all(torch.equal(a, b) for a, b in zip(mine, other))
            hint = ("the ranks agree with each other, so the average is there: check its scale, "
                    "the pseudo-gradient's sign and the outer optimizer's step") if same else \
                ("the ranks ended with different weights: every rank must load the same global "
                 "copy after the outer step")
            return False, f"rank {rank}'s weights differ from the reference by {worst:.2e}; {hint}"
    return True, "3 outer steps on 2 ranks: weights equal to the reference outer step's"


def check_bytes_per_step(answer) -> Feedback:
    """Bytes per inner step a rank sends with H = 8 on 4 ranks (a ring all-reduce of fp32)."""
    world, H = 4, 8
    expected = 4 * mlp_param_count(SIZES) * 2 * (world - 1) / world / H
    return check_number(answer, expected, rtol=0.01, name="bytes per inner step", unit="B",
                        hint="one all-reduce of the whole fp32 model, shared out over H steps")
