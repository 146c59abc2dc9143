"""Sharding the data, and what breaks when data parallelism is done wrong (chapter 2).

:func:`sampler_shards` shows how ``torch.utils.data.DistributedSampler`` deals a dataset's
indices to ranks: disjoint, together covering the dataset (padded by repeating a few indices when
it does not divide), reshuffled per epoch with ``set_epoch``, with the *same* seed on every rank
(which keeps the shards disjoint; :func:`course_lib.common.data.get_batch` does the same for
random windows: one global draw from a shared seed, then rank ``r`` takes its rows). Seeding the
ranks differently gives overlapping random batches; forgetting to shard gives *identical* ones.
:func:`what_breaks` trains the hand-written DP (:mod:`course_lib.data_parallel.by_hand`) with
three classic mistakes and measures what each one really computes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler

from course_lib.common.checks import is_int, positive_int
from course_lib.data_parallel.by_hand import average_gradients
from course_lib.data_parallel.measure import max_diff, train_rank_dp, train_single
from course_lib.launcher.launch import run

__all__ = ["sampler_shards", "MISTAKES", "MistakeResult", "what_breaks", "format_mistakes"]


def sampler_shards(n_samples: int, world: int, *, epoch: int = 0, shuffle: bool = True,
                   seed: int = 0) -> list[list[int]]:
    """The dataset indices ``DistributedSampler`` gives each of ``world`` ranks in ``epoch``."""
    positive_int(n_samples, "n_samples")
    positive_int(world, "world")
    shards = []
    for rank in range(world):  # num_replicas/rank given explicitly: no process group needed
        sampler = DistributedSampler(range(n_samples), num_replicas=world, rank=rank,
                                     shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)   # forget this and every epoch repeats the same order
        shards.append(list(sampler))
    return shards


def _summed(model: nn.Module) -> None:
    """Mistake: all-reduce without dividing by the world size."""
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad)


def _no_communication(model: nn.Module) -> None:
    """Mistake: keep the local gradients."""


#: name -> (sync function, every rank gets its own shard?)
MISTAKES: dict[str, tuple[Callable[[nn.Module], None], bool]] = {
    "correct": (average_gradients, True),
    "sum, not average": (_summed, True),
    "no communication": (_no_communication, True),
    "same batch on every rank": (average_gradients, False),
}


@dataclass(frozen=True)
class MistakeResult:
    """What one variant of DP computed, measured against one-process references."""

    name: str
    vs_global: float       # max |weights - one process on the N·b-row global batch|
    ranks_spread: float    # max |rank r - rank 0|
    equals: str            # the reference it matches instead
    vs_equals: float       # max |weights of rank 0 - that reference|


def _mistake_rank(steps: int, local_batch: int, seq_len: int, lr: float, seed: int, preset: str):
    """Every variant on every rank; rank 0 also trains the one-process references."""
    out = {name: train_rank_dp("hand", steps, local_batch, seq_len, lr, seed, preset, sync=sync,
                            shard=shard)[0] for name, (sync, shard) in MISTAKES.items()}
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        out["references"] = {
            "one process, N·b rows": (local_batch * world, lr),
            "one process, N·b rows, lr × N": (local_batch * world, lr * world),
            "one process, b rows (rank 0)": (local_batch, lr)}
        for label, (batch, rate) in out["references"].items():
            out["references"][label] = train_single(steps, batch, seq_len, lr=rate, seed=seed,
                                                    preset=preset)[0]
    return out


#: the one-process run each variant turns out to equal (checked by :func:`what_breaks`)
_INSTEAD = {"correct": "one process, N·b rows",
            "sum, not average": "one process, N·b rows, lr × N",
            "no communication": "one process, b rows (rank 0)",
            "same batch on every rank": "one process, b rows (rank 0)"}


def what_breaks(world: int = 2, steps: int = 3, local_batch: int = 4, seq_len: int = 32, *,
                lr: float = 0.1, seed: int = 0, preset: str = "tiny") -> list[MistakeResult]:
    """Train hand DP correctly and with each mistake; compare with one-process references.

    What each mistake equals instead (measured, see :func:`format_mistakes`): summing without
    dividing is one process with an ``N``× larger learning rate (for SGD); no communication
    lets every rank train on its own shard alone, so the replicas drift apart (rank 0 equals one
    process on ``b`` rows); the same batch on every rank is one process on ``b`` rows — ``N``
    times the compute for a ``1/N`` batch.
    """
    if not is_int(world) or world < 2:
        raise ValueError(f"world must be an integer >= 2 to show the mistakes, got {world!r}")
    per_rank = run(_mistake_rank, world, steps, local_batch, seq_len, lr, seed, preset,
                   device="cpu", threads=1)
    references = per_rank[0]["references"]
    single = references[_INSTEAD["correct"]]
    rows = []
    for name in MISTAKES:
        mine = per_rank[0][name]
        spread = max(max_diff(r[name], mine) for r in per_rank)
        rows.append(MistakeResult(name, max_diff(mine, single), spread, _INSTEAD[name],
                                  max_diff(mine, references[_INSTEAD[name]])))
    return rows


def format_mistakes(rows: list[MistakeResult]) -> str:
    """A table with verdicts (``same``/``differs`` at ``course_lib.data_parallel.measure.TOLERANCE``'s atol)."""
    def verdict(x: float) -> str:
        return "same" if x <= 1e-6 else f"differs ({x:.0e})"

    lines = [f"{'variant':<26}{'vs one process, N·b rows':<26}{'ranks agree?':<16}equals instead"]
    for r in rows:
        agree = "yes" if r.ranks_spread == 0 else "NO"
        lines.append(f"{r.name:<26}{verdict(r.vs_global):<26}{agree:<16}"
                     f"{r.equals}: {verdict(r.vs_equals)}")
    return "\n".join(lines)
