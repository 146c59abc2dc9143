"""DDP by hand with gradient buckets that overlap backward (chapter 2).

:func:`course_lib.data_parallel.by_hand.average_gradients` waits for the whole backward, then
all-reduces one tensor at a time. torch's DDP does better (:mod:`course_lib.data_parallel.
ddp_internals` measures it): it packs the gradients into **buckets** and launches a bucket's
all-reduce *while backward is still computing the earlier layers*. The same, by hand:

* :func:`make_buckets` — DDP's rule: walk the parameters last first (backward produces the
  last layer's gradients first) and close a bucket once it holds at least ``cap_bytes``; a
  tensor is never split. These are the buckets DDP rebuilds after its first step;
* :class:`OverlappedDDP` — a hook on every parameter (``register_post_accumulate_grad_hook``)
  counts the gradients of its bucket; when the bucket is full, the hook flattens it and starts
  ``all_reduce(..., async_op=True)``, which returns at once while gloo (or NCCL) sends in the
  background. ``finish()`` — after backward, before the optimizer step — waits on every work
  handle, divides by the world size and copies the averages back into ``.grad``.

:func:`compare_overlapped` trains it on real ranks next to torch's DDP (same bucket cap) and one
process on the global batch, and returns when each bucket was launched, counted in gradients
produced so far: a count, not a time, so it is the same on every machine.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.data_parallel.by_hand import (_params, _validate, broadcast_parameters, max_diff,
                                              train_single, train_steps)
from course_lib.data_parallel.ddp_internals import BucketLog, recording_allreduce_hook
from course_lib.launcher.launch import run

__all__ = ["make_buckets", "OverlappedDDP", "OverlapComparison", "compare_overlapped",
           "DEFAULT_CAP_BYTES"]

#: 160 KiB: the tiny GPT's 535 KiB of fp32 gradients make two full buckets and a smaller last
#: one (DDP's default cap is 25 MiB).
DEFAULT_CAP_BYTES = 160 * 2 ** 10


def make_buckets(params, cap_bytes):
    """Group ``params`` into buckets of at least ``cap_bytes`` (the last may hold less), last first."""
    buckets, current, size = [], [], 0
    for p in reversed(params):               # backward produces the last layer's gradients first
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= cap_bytes:                # full: close it (a tensor is never split)
            buckets.append(current)
            current, size = [], 0
    if current:                              # the first parameters' bucket: flush it too
        buckets.append(current)
    return buckets


class OverlappedDDP:
    """DDP by hand: each bucket is all-reduced (async) as soon as backward has filled it."""

    def __init__(self, buckets):
        self.buckets, self.launched, self.log = buckets, [], []
        self.missing = [len(b) for b in buckets]      # gradients each bucket still waits for
        self.arrived = 0                              # gradients produced so far in this backward
        for i, bucket in enumerate(buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self.grad_ready(i))

    def grad_ready(self, i):
        """Autograd calls this when a parameter of bucket ``i`` has its gradient."""
        self.arrived += 1
        self.missing[i] -= 1
        if self.missing[i] == 0:                      # bucket full: launch, do not wait
            flat = torch.cat([p.grad.flatten() for p in self.buckets[i]])
            work = dist.all_reduce(flat, async_op=True)
            self.launched.append((i, flat, work))
            self.log.append((i, self.arrived))        # launched after this many gradients

    def finish(self):
        """After backward, before the step: wait for each bucket, average, copy back."""
        for i, flat, work in self.launched:
            work.wait()
            flat /= dist.get_world_size()
            sizes = [p.numel() for p in self.buckets[i]]
            for p, g in zip(self.buckets[i], flat.split(sizes)):
                p.grad.copy_(g.view_as(p))
        log, self.log, self.launched = self.log, [], []
        self.missing, self.arrived = [len(b) for b in self.buckets], 0
        return log


@dataclass(frozen=True)
class OverlapComparison:
    """Hand-bucketed DP, torch DDP (same cap) and one process after the same SGD steps."""

    world: int
    steps: int
    cap_bytes: int
    hand_vs_single: float
    torch_vs_single: float
    hand_vs_torch: float
    ranks_spread: float              # largest difference between any rank and rank 0 (hand)
    n_grads: int                     # gradients one backward produces (= parameter tensors)
    buckets: list[tuple[int, int]]   # (tensors, bytes) of each hand bucket, in launch order
    ddp_buckets: list[tuple[int, int]]  # the same for DDP's buckets (last step, comm hook)
    launches: list[tuple[int, int]]  # last step, rank 0: (bucket, gradients produced by then)


def _layout(buckets) -> list[tuple[int, int]]:
    return [(len(b), sum(p.numel() * p.element_size() for p in b)) for b in buckets]


def _overlap_rank(ddp_class, bucket_fn, steps: int, local_batch: int, seq_len: int, lr: float,
                  seed: int, preset: str, cap_bytes: int) -> dict:
    """On each rank: DP with ``ddp_class`` buckets, then torch DDP; rank 0 also one process."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def my_shard(step: int):
        return get_batch(local_batch, seq_len, seed=seed, step=step, rank=rank, world_size=world)

    torch.manual_seed(seed + rank)               # different on purpose: the broadcast fixes it
    model = GPT(get_config(preset))
    broadcast_parameters(model)
    buckets = bucket_fn(list(model.parameters()), cap_bytes)
    hand, launches = ddp_class(buckets), []
    train_steps(model, my_shard, steps, lr=lr, sync=lambda m: launches.append(hand.finish()))

    torch.manual_seed(seed + rank)
    reference = DDP(GPT(get_config(preset)), bucket_cap_mb=cap_bytes / 2 ** 20)
    log = BucketLog()
    reference.register_comm_hook(log, recording_allreduce_hook)

    def logged_shard(step: int):                 # keep only the last step's buckets
        log.start()
        return my_shard(step)

    train_steps(reference, logged_shard, steps, lr=lr)
    out = {"hand": _params(model), "torch": _params(reference), "launches": launches[-1],
           "buckets": _layout(buckets), "n_grads": len(list(model.parameters())),
           "ddp_buckets": [(r["n_tensors"], r["nbytes"]) for r in log.records]}
    if rank == 0:
        out["single"] = train_single(steps, local_batch * world, seq_len, lr=lr, seed=seed,
                                     preset=preset)[0]
    return out


def compare_overlapped(ddp_class=OverlappedDDP, bucket_fn=make_buckets, world: int = 2,
                       steps: int = 3, local_batch: int = 4, seq_len: int = 32, *,
                       cap_bytes: int = DEFAULT_CAP_BYTES, lr: float = 0.1, seed: int = 0,
                       preset: str = "tiny") -> OverlapComparison:
    """Train ``ddp_class(bucket_fn(params, cap_bytes))`` on ``world`` real ranks; compare.

    Pass the notebook's own class and bucket function: they are shipped to the ranks by value,
    so an edit in the cell changes what the ranks run. The reference is torch's DDP with
    ``bucket_cap_mb = cap_bytes / 2**20``, and one process on the whole global batch.
    """
    _validate(world, steps, local_batch, seq_len, preset)
    if not (isinstance(cap_bytes, int) and cap_bytes > 0):
        raise ValueError(f"cap_bytes must be a positive integer, got {cap_bytes!r}")
    ranks = run(_overlap_rank, world, ddp_class, bucket_fn, steps, local_batch, seq_len, lr,
                seed, preset, cap_bytes, device="cpu", threads=1)
    first = ranks[0]
    return OverlapComparison(
        world, steps, cap_bytes, max_diff(first["hand"], first["single"]),
        max_diff(first["torch"], first["single"]), max_diff(first["hand"], first["torch"]),
        max(max_diff(r["hand"], first["hand"]) for r in ranks), first["n_grads"],
        first["buckets"], first["ddp_buckets"], first["launches"])

