"""Chapter 10's exercise checks: the learner's divergence checker, and a diagnosis.

``check_checker(first_difference)`` runs the learner's ``first_difference(model)`` on 2 real ranks
against four models: identical; two entries of ``0.weight`` swapped on rank 1 (a sum cannot see
it); ``1.running_mean`` (a buffer) changed on rank 1; ``0.bias`` and ``4.bias`` changed (the
first must be named). Every rank must return what :func:`.divergence.first_divergence` names.
``check_diagnosis(rank, cause)`` checks the answer to the chapter's mystery run.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.debugging.divergence import first_divergence
from course_lib.debugging.measure import small_model
from course_lib.exercises import Feedback, check_choice
from course_lib.launcher.launch import run

__all__ = ["CASES", "check_checker", "DIAGNOSES", "MYSTERY", "check_diagnosis"]

CASES = ("identical", "two entries swapped", "a buffer differs", "two tensors differ")


def _model(case: str, rank: int):
    torch.manual_seed(0)
    model = small_model()
    if rank == 1:
        with torch.no_grad():
            w = model[0].weight
            if case == "two entries swapped":
                w[0, 0], w[0, 1] = w[0, 1].clone(), w[0, 0].clone()
            elif case == "a buffer differs":
                model[1].running_mean += 1.0
            elif case == "two tensors differ":
                model[0].bias += 1.0
                model[4].bias += 1.0
    return model


def _compare(first_difference) -> list:
    rank, rows = dist.get_rank(), []
    for case in CASES:
        want = first_divergence(_model(case, rank))
        got = first_difference(_model(case, rank))
        rows.append((case, None if want is None else want[0], got))
    return rows


def check_checker(first_difference) -> tuple[bool, str]:
    """For ``check_true``: every rank, every case, the same name as the library's checker."""
    for rank, rows in enumerate(run(_compare, 2, first_difference)):
        for case, want, got in rows:
            if got != want:
                return False, (f"{case}: rank {rank} returned {got!r}, the first tensor that "
                               f"differs is {want!r}")
    return True, f"right on both ranks in all {len(CASES)} cases ({', '.join(CASES)})"


DIAGNOSES = ("shapes differ", "never calls the collective", "waits on a different group",
             "weights drift", "NaN in its batch", "straggler")
MYSTERY = (2, "waits on a different group")  # the chapter's mystery run


def check_diagnosis(rank, cause) -> Feedback:
    """The broken rank and the cause of the chapter's mystery run."""
    name = "diagnose the mystery run"
    if rank is ... or cause is ...:
        return Feedback(False, "not answered yet: set answer_rank and answer_cause.", name)
    if rank != MYSTERY[0]:
        return Feedback(False, f"rank {rank!r} is not it: a rank whose stack ends in the "
                               "collective is waiting for someone; which rank is elsewhere?", name)
    return check_choice(cause, MYSTERY[1], DIAGNOSES, name=name,
                        hint="read the source line rank 2's stack stops at, argument by argument")
