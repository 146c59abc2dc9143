"""The order of actions torch's pipeline schedules plan, read from the schedule objects themselves.

``torch.distributed.pipelining``'s multi-stage schedules (interleaved 1F1B, ZB-V) compute, when
constructed, ``pipeline_order``: for every rank, the list of actions per time step (``"2F0"`` =
stage 2 forward of micro-batch 0; ``B`` full backward, ``I`` input gradient, ``W`` weight
gradient; ``None`` idle). :func:`torch_schedule_order` builds the schedule on ``p`` real ranks
(stages of a 2×2 linear layer: the plan does not depend on the model) and returns that plan;
chapter 9 draws it beside the bubble it measured. Nothing here is re-derived by the course.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.common.checks import positive_int
from course_lib.launcher.launch import run
from course_lib.pipeline_parallel.torch_schedules import TORCH_SCHEDULES, stages_of_rank

__all__ = ["torch_schedule_order"]


def _order_rank(schedules: tuple[str, ...], m: int) -> dict[str, dict[int, list]]:
    """Inside a rank: construct each schedule over this rank's stages, return its plan."""
    import torch.distributed.pipelining as pipelining
    from torch.distributed.pipelining import PipelineStage
    rank, p = dist.get_rank(), dist.get_world_size()
    out = {}
    for name in schedules:
        kind, v = TORCH_SCHEDULES[name]
        stages = [PipelineStage(torch.nn.Linear(2, 2), s, p * v, torch.device("cpu"))
                  for s in stages_of_rank(name, rank, p)]
        sched = getattr(pipelining, kind)(stages if v > 1 else stages[0], n_microbatches=m,
                                          loss_fn=lambda out, target: out.sum())
        order = getattr(sched, "pipeline_order", None) or {}
        out[name] = {r: [None if a is None else str(a) for a in acts] for r, acts in order.items()}
    return out


def torch_schedule_order(schedules=("interleaved-1f1b", "zb-v"), p: int = 2,
                         m: int = 4) -> dict[str, dict[int, list]]:
    """``{schedule: {rank: [action or None per time step]}}`` as torch plans it for ``p`` ranks
    and ``m`` micro-batches (one launch of ``p`` ranks). Only the multi-stage schedules: torch's
    plans for GPipe and 1F1B list each rank's order without idle steps (not aligned in time)."""
    schedules = tuple(schedules)
    positive_int(p, "p")
    positive_int(m, "m")
    for name in schedules:
        if name not in TORCH_SCHEDULES or TORCH_SCHEDULES[name][1] < 2:
            multi = sorted(k for k, (_, v) in TORCH_SCHEDULES.items() if v > 1)
            raise ValueError(f"{name!r}: torch's plan for a single-stage schedule is each rank's "
                             f"order without idle steps, not time steps; choose from {multi}")
    if p < 2 or m < p:
        raise ValueError(f"p={p}, m={m}: need p >= 2 ranks and m >= p micro-batches")
    return run(_order_rank, p, schedules, m, threads=1)[0]
