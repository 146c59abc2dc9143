"""FSDP2's all-gathers and reduce-scatters on every rank, as they ran (chapter 03's timeline).

Two (or more) ranks train a GPT under ``fully_shard`` (``wrap(model, "fsdp")``: one unit per
block, reshard after forward); after warm-up steps one step is recorded with
:class:`~course_lib.common.timeline.Timeline`: each block's forward and backward in the compute
lane, every collective FSDP2 issues in the comm lane. An all-gather that starts before the
block it serves is FSDP's prefetch; each block's reduce-scatter follows its backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.common.checks import positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.common.timeline import Span, Timeline
from course_lib.launcher.launch import run
from course_lib.sharding.strategies import shard_units, train_step, wrap

__all__ = ["fsdp_timeline"]


def _fsdp_timeline_rank(preset: str, batch: tuple[int, int], warmup: int) -> list[Span]:
    config = get_config(preset)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = GPT(config)
    wrapped = wrap(model, "fsdp", optimizer="sgd")
    tl = Timeline()
    handles = tl.watch((f"block{k}", unit) for k, unit in enumerate(shard_units(model)))
    inputs, targets = get_batch(*batch, seed=0, rank=rank, world_size=world)
    data = (inputs % config.vocab_size, targets % config.vocab_size)
    for _ in range(warmup + 1):
        tl.reset()
        dist.barrier()
        with tl:
            train_step(wrapped, data)
    for h in handles:
        h.remove()
    return tl.events()


def fsdp_timeline(nprocs: int = 2, preset: str = "tiny", batch: tuple[int, int] = (8, 64),
                  warmup: int = 2, timeout: float = 60.0) -> list[Span]:
    """One recorded FSDP2 step on ``nprocs`` ranks (one thread each): every rank's spans."""
    positive_int(nprocs, "nprocs")
    positive_int(warmup, "warmup")
    get_config(preset)
    per_rank = run(_fsdp_timeline_rank, nprocs, preset, tuple(batch), warmup, threads=1,
                   timeout=timeout)
    return [s for spans in per_rank for s in spans]
