"""Sharding the data, what breaks when DP is done wrong, and the gradient-averaging exercise.

Chapter 2 (``02_data_parallel``), after :mod:`course_lib.ddp`:

* :func:`sampler_shards` shows how ``torch.utils.data.DistributedSampler`` deals a dataset's
  indices to ranks: disjoint, together covering the dataset (padded by repeating a few indices
  when it does not divide), reshuffled per epoch with ``set_epoch`` — with the *same* seed on
  every rank, which is what keeps the shards disjoint. (:func:`course_lib.data.get_batch` does
  the same for random windows: one global draw from a seed shared by all ranks, then rank ``r``
  takes its rows.) Seeding each rank differently and drawing independently would give
  overlapping random batches; forgetting to shard gives *identical* ones;
* :func:`what_breaks` trains the hand-written DP with three classic mistakes and measures what
  each one really computes;
* :func:`check_average_gradients` runs a learner's ``average_gradients(model)`` on real ranks
  next to torch's DDP and says what is wrong (for ``course_lib.check_true``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course_lib.data import get_batch
from course_lib.exercises import Feedback, check_number
from course_lib.ddp import average_gradients, max_diff, train_rank, train_single
from course_lib.launch import run
from course_lib.models import GPT, get_config

__all__ = ["sampler_shards", "MISTAKES", "MistakeResult", "what_breaks", "format_mistakes",
           "check_average_gradients", "check_ring_bytes"]


def sampler_shards(n_samples: int, world: int, *, epoch: int = 0, shuffle: bool = True,
                   seed: int = 0) -> list[list[int]]:
    """The dataset indices ``DistributedSampler`` gives each of ``world`` ranks in ``epoch``."""
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive integer, got {world!r}")
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
    out = {name: train_rank("hand", steps, local_batch, seq_len, lr, seed, preset, sync=sync,
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
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
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
    """A table with verdicts (``same``/``differs`` at ``course_lib.ddp.TOLERANCE``'s atol)."""
    def verdict(x: float) -> str:
        return "same" if x <= 1e-6 else f"differs ({x:.0e})"

    lines = [f"{'variant':<26}{'vs one process, N·b rows':<26}{'ranks agree?':<16}equals instead"]
    for r in rows:
        agree = "yes" if r.ranks_spread == 0 else "NO"
        lines.append(f"{r.name:<26}{verdict(r.vs_global):<26}{agree:<16}"
                     f"{r.equals}: {verdict(r.vs_equals)}")
    return "\n".join(lines)


def _check_rank(fn: Callable[[nn.Module], None], seed: int) -> dict:
    """On each rank: local gradients, the learner's result, DDP's averaged gradients."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = GPT(get_config("tiny"))
    reference = DDP(copy.deepcopy(model))
    inputs, targets = get_batch(2, 16, seed=seed, rank=rank, world_size=world)
    for m in (model, reference):
        GPT.loss(m(inputs), targets).backward()
    local = {n: p.grad.clone() for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fn(model)
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    if missing:
        return {"error": f"the gradient of {missing[0]} is None after your function"}
    return {"mine": {n: p.grad.clone() for n, p in model.named_parameters()},
            "ddp": {n: p.grad.clone() for n, p in reference.module.named_parameters()},
            "local": local, "weights_changed": max_diff(before, dict(model.named_parameters()))}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    try:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)  # fp32 sums in another order
    except AssertionError:
        return False
    return True


def check_average_gradients(fn: Callable[[nn.Module], None], world: int = 3,
                            seed: int = 0) -> tuple[bool, str]:
    """Run the learner's ``fn(model)`` after backward on ``world`` real ranks; compare with DDP.

    Returns ``(passed, message)`` for :func:`course_lib.check_true`. Three ranks by default, so
    a hard-coded ``/ 2`` fails as well as a forgotten division. The expected gradients come from
    torch's ``DistributedDataParallel`` on the same model and data, not from this module.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself (average_gradients, no parentheses), "
                        f"got {type(fn).__name__}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise ValueError(f"world must be an integer >= 2 (one rank has nothing to average), "
                         f"got {world!r}")
    results = run(_check_rank, world, fn, seed, device="cpu", threads=1)
    for rank, res in enumerate(results):
        if "error" in res:
            return False, f"on rank {rank}: {res['error']}."
        if res["weights_changed"] > 0:
            return False, "your function changed the weights; it should only change .grad."
        if _close(res["mine"], res["ddp"]):
            continue
        if _close(res["mine"], res["local"]):
            return False, (f"rank {rank} still holds its own local gradients: nothing was "
                           "communicated (all_reduce each param.grad).")
        scaled = {n: g * world for n, g in res["ddp"].items()}
        if _close(res["mine"], scaled):
            return False, (f"the gradients are {world}× too large on {world} ranks: you summed "
                           "them; divide by the world size to average.")
        return False, (f"rank {rank}'s gradients differ from DDP's averaged ones (did you divide "
                       "by dist.get_world_size(), not a fixed number?).")
    return True, f"your averaged gradients equal torch DDP's on all {world} ranks."


def check_ring_bytes(answer: object, n_params: int, world: int,
                     measured: int | None = None) -> Feedback:
    """Exercise: bytes one rank sends per step in a ring all-reduce of ``n_params`` fp32 grads.

    Compared with ``measured`` (bytes rank 0 wrote to its sockets in one DDP step, from
    :func:`course_lib.ddp_internals.measure_dp`) when given, else with the ring formula. The
    measurement exceeds the formula only by gloo's small per-message envelope (< 1 %).
    """
    for name, value in (("n_params", n_params), ("world", world)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    expected = measured if measured is not None else 2 * (world - 1) / world * 4 * n_params
    return check_number(answer, expected, rtol=0.01, name="ring bytes", unit="bytes",
                        hint="a ring all-reduce is a reduce-scatter then an all-gather; in each "
                             "half a rank sends N-1 chunks of 1/N of the 4·Ψ bytes.")
