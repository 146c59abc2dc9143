"""Chapter 2's exercise checks: gradient averaging, gradient buckets, bytes of a ring all-reduce.

:func:`check_average_gradients` runs the learner's ``average_gradients(model)`` on real ranks
next to torch's DDP and says what is wrong (for ``course_lib.check_true``);
:func:`check_make_buckets` runs :class:`~course_lib.data_parallel.buckets.DDPByHand` with the
learner's ``make_buckets`` on real ranks and compares its buckets and gradients with DDP's;
:func:`check_ring_bytes` compares an answer with bytes measured on the sockets. The learner's
whole DDP class is checked by :mod:`course_lib.data_parallel.exercises_ddp`.
"""
from __future__ import annotations

import copy
from unittest import mock
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.checks import is_int, positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.data_parallel import buckets as buckets_module
from course_lib.data_parallel.measure import max_diff
from course_lib.data_parallel.measure_buckets import DEFAULT_CAP_BYTES
from course_lib.data_parallel.ddp_internals import BucketLog, recording_allreduce_hook
from course_lib.exercises import Feedback, check_number
from course_lib.launcher.launch import run

__all__ = ["check_average_gradients", "check_make_buckets", "check_ring_bytes"]


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
    if not is_int(world) or world < 2:
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
                           "communicated. Is the dist.all_reduce of each param.grad missing?")
        if _close(res["mine"], {n: g / world for n, g in res["local"].items()}):
            return False, (f"rank {rank} holds its own gradients divided by {world}: the division "
                           "is there, the dist.all_reduce that sums over the ranks is missing.")
        scaled = {n: g * world for n, g in res["ddp"].items()}
        if _close(res["mine"], scaled):
            return False, (f"the gradients are {world}× too large on {world} ranks: you summed "
                           "them. Did you divide by the world size?")
        return False, (f"rank {rank}'s gradients differ from DDP's averaged ones (did you divide "
                       "by dist.get_world_size(), not a fixed number?).")
    return True, f"your averaged gradients equal torch DDP's on all {world} ranks."


def _bucket_problem(buckets: object, params: list[torch.Tensor]) -> str | None:
    """What makes ``buckets`` unusable (not a list of lists of the params, a param twice)."""
    if not isinstance(buckets, (list, tuple)) or not all(isinstance(b, (list, tuple))
                                                         for b in buckets):
        return (f"return a list of buckets, each a list of parameters (got "
                f"{type(buckets).__name__}).")
    ids, seen = {id(p) for p in params}, set()
    for i, bucket in enumerate(buckets):
        for p in bucket:
            if id(p) not in ids:
                return (f"bucket {i} holds something that is not one of the parameters you were "
                        "given (put the parameters themselves in, not copies).")
            if id(p) in seen:
                return f"a parameter is in two buckets (the second is bucket {i})."
            seen.add(id(p))
    return None


def _buckets_rank(fn: Callable, cap_bytes: int, seed: int) -> dict:
    """On each rank: DDP's own buckets (after its rebuild), then the learner's, and the grads."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = GPT(get_config("tiny"))
    reference = DDP(copy.deepcopy(model), bucket_cap_mb=cap_bytes / 2 ** 20)
    log = BucketLog()
    reference.register_comm_hook(log, recording_allreduce_hook)
    inputs, targets = get_batch(2, 16, seed=seed, rank=rank, world_size=world)
    for _ in range(2):                # DDP rebuilds its buckets in backward's order after step 1
        log.start()
        reference.zero_grad(set_to_none=True)
        GPT.loss(reference(inputs), targets).backward()
    names = {id(p): n for n, p in model.named_parameters()}
    with mock.patch.object(buckets_module, "make_buckets", fn):   # DDPByHand, the learner's rule
        hand = buckets_module.DDPByHand(model, bucket_cap_mb=cap_bytes / 2 ** 20)
    buckets = hand.buckets
    GPT.loss(hand(inputs), targets).backward()
    hand.finish_gradient_synchronization()
    ddp = dict(reference.module.named_parameters())
    return {"layout": [(len(b), sum(p.numel() * p.element_size() for p in b)) for b in buckets],
            "ddp": [(r["n_tensors"], r["nbytes"]) for r in log.records],
            "first": [names[id(p)] for p in buckets[0]] if buckets else [],
            "wrong": [n for n, p in model.named_parameters()
                      if not _close({n: p.grad}, {n: ddp[n].grad})]}


def check_make_buckets(fn: Callable, world: int = 2, cap_bytes: int = DEFAULT_CAP_BYTES,
                       seed: int = 0) -> tuple[bool, str]:
    """Run ``DDPByHand`` with the learner's ``fn(params, cap_bytes)`` as its bucket rule on ranks.

    Returns ``(passed, message)``. Passes when every gradient equals torch DDP's average and the
    buckets are the ones DDP itself builds with ``bucket_cap_mb = cap_bytes / 2**20`` (read by a
    communication hook after DDP's rebuild): as many tensors and bytes each, in the same order.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself (make_buckets, no parentheses), "
                        f"got {type(fn).__name__}")
    if not is_int(world) or world < 2:
        raise ValueError(f"world must be an integer >= 2, got {world!r}")
    with torch.device("meta"):
        params = list(GPT(get_config("tiny")).parameters())
    buckets = fn(params, cap_bytes)  # here first: a malformed answer fails before any process
    problem = _bucket_problem(buckets, params)
    if problem:
        return False, problem
    results = run(_buckets_rank, world, fn, cap_bytes, seed, device="cpu", threads=1)
    bucketed = {id(p) for b in buckets for p in b}
    left = [p for p in params if id(p) not in bucketed]
    res = results[0]
    if left:
        wrong = sum(len(r["wrong"]) for r in results) // world
        return False, (f"{len(left)} of {len(params)} parameters are in no bucket: no hook "
                       f"launches their all-reduce, and on {world} real ranks {wrong} gradients "
                       "still differ from DDP's averages after finish().")
    if any(r["wrong"] for r in results):
        return False, (f"the gradients of {len(res['wrong'])} parameters (e.g. {res['wrong'][0]}) "
                       "differ from DDP's averaged ones.")
    if res["layout"] == res["ddp"]:
        return True, (f"your {len(res['layout'])} buckets are the ones DDP builds itself (as many "
                      f"tensors and bytes each, in the same order) and the gradients equal DDP's "
                      f"on {world} ranks.")
    if res["first"] and res["first"][0] == "tok_emb.weight":
        return False, ("your first bucket starts with tok_emb.weight, whose gradient backward "
                       "produces last: that bucket could only be sent once backward is over. "
                       "(The gradients are right; the overlap is lost.)")
    for i, (mine, theirs) in enumerate(zip(res["layout"], res["ddp"])):
        if mine != theirs:
            return False, (f"bucket {i} holds {mine[0]} tensors ({mine[1]:,} bytes), DDP's "
                           f"{theirs[0]} ({theirs[1]:,} bytes): DDP closes a bucket once it "
                           "holds at least cap_bytes, and never splits a tensor.")
    return False, (f"you made {len(res['layout'])} buckets, DDP {len(res['ddp'])} with the same "
                   "cap.")


def check_ring_bytes(answer: object, n_params: int, world: int,
                     measured: int | None = None) -> Feedback:
    """Exercise: bytes one rank sends per step in a ring all-reduce of ``n_params`` fp32 grads.

    Compared with ``measured`` (bytes rank 0 wrote to its sockets in one DDP step, from
    :func:`course_lib.data_parallel.ddp_internals.measure_dp`) when given, else with the ring formula. The
    measurement exceeds the formula only by gloo's small per-message envelope (< 1 %).
    """
    for name, value in (("n_params", n_params), ("world", world)):
        positive_int(value, f"{name}")
    expected = measured if measured is not None else 2 * (world - 1) / world * 4 * n_params
    return check_number(answer, expected, rtol=0.01, name="ring bytes", unit="bytes",
                        hint="a ring all-reduce is a reduce-scatter then an all-gather; in each "
                             "half a rank sends N-1 chunks of 1/N of the 4·Ψ bytes.")
