"""Chapter 3's code exercises, run on real ranks: ``shard_bounds``, FSDP by hand's full-parameter
gather, and FSDP's unit hooks (kept for the library's tests and for teachers).

:func:`check_shard_bounds` runs the learner's function on ``world`` ranks for a few buffer sizes,
all-gathers the shards as ZeRO does and compares the bounds with ``torch.chunk``'s pieces, saying
what is off (a gap, an overlap, past the end, unequal shares) without the formula.
:func:`check_full_state_dict` compares the learner's gather with
:func:`~course_lib.sharding.fsdp_by_hand.fsdp_full_state_dict` after two training steps.
:func:`check_fsdp_unit` plugs ``pre_forward(unit)`` / ``post_backward(unit)`` into
:class:`~course_lib.sharding.fsdp_by_hand.FSDPByHand` and compares it with ``fully_shard``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from course_lib.common.checks import is_int
from course_lib.common.models import get_config, param_count
from course_lib.launcher.launch import run
from course_lib.common.data import get_batch
from course_lib.common.models import GPT
from course_lib.sharding.fsdp_by_hand import FSDPByHand, FSDPUnit, fsdp_full_state_dict
from course_lib.sharding.hand_measure import train_fsdp_rank, train_torch_fsdp_rank

__all__ = ["check_shard_bounds", "check_fsdp_unit", "check_full_state_dict", "SIZES"]

#: Buffer sizes the check tries: smaller than the world, not divisible, divisible, the tiny GPT.
SIZES = (2, 10, 11, 12, param_count(get_config("tiny")))


def _bounds_rank(fn: Callable, sizes: tuple[int, ...]) -> dict:
    """On each rank: the learner's bounds per size, and whether all-gathering rebuilt the buffer."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for numel in sizes:
        start, stop = fn(numel, rank, world)
        flat = torch.arange(numel)
        shards = [None] * world
        dist.all_gather_object(shards, flat[start:stop].clone())   # every rank's shard, in rank order
        out[numel] = {"bounds": (start, stop), "rebuilt": torch.equal(torch.cat(shards), flat)}
    return out


def _problem(numel: int, world: int, bounds: list) -> str | None:
    """What is wrong with all ranks' ``(start, stop)`` for one size, or None."""
    for rank, (start, stop) in enumerate(bounds):
        if not (0 <= start <= stop <= numel):
            return (f"with numel={numel} on {world} ranks, rank {rank}'s bounds ({start}, {stop}) "
                    "are not a slice of the buffer (need 0 <= start <= stop <= numel).")
    owners = [0] * numel
    for start, stop in bounds:
        for i in range(start, stop):
            owners[i] += 1
    if any(o > 1 for o in owners):
        return (f"with numel={numel} on {world} ranks, {sum(o > 1 for o in owners)} elements "
                "belong to two ranks: the shards overlap.")
    if any(o == 0 for o in owners):
        return (f"with numel={numel} on {world} ranks, {owners.count(0)} elements belong to no "
                "rank: nobody updates them, and the all-gather cannot rebuild them.")
    if [b[0] for b in bounds] != sorted(b[0] for b in bounds):
        return f"with numel={numel}, the shards are not in rank order (the all-gather is)."
    expected = [len(piece) for piece in torch.arange(numel).chunk(world)]
    expected += [0] * (world - len(expected))
    mine = [stop - start for start, stop in bounds]
    if mine != expected:
        rank = next(r for r, (a, b) in enumerate(zip(mine, expected)) if a != b)
        return (f"your shards cover the buffer, but with numel={numel} on {world} ranks rank "
                f"{rank} owns {mine[rank]} elements where torch.chunk gives it "
                f"{'more' if mine[rank] < expected[rank] else 'fewer'}: equal shards (the last "
                "ones shorter) are what reduce-scatter and all-gather need.")
    return None


def check_shard_bounds(fn: Callable, world: int = 3) -> tuple[bool, str]:
    """Run the learner's ``fn(numel, rank, world)`` on ``world`` real ranks; compare with
    ``torch.chunk``. Returns ``(passed, message)``. Three ranks by default: most sizes then do
    not divide evenly."""
    if not callable(fn):
        raise TypeError(f"pass your function itself (shard_bounds, no parentheses), "
                        f"got {type(fn).__name__}")
    if not is_int(world) or world < 2:
        raise ValueError(f"world must be an integer >= 2, got {world!r}")
    first = fn(SIZES[1], 0, world)  # here first: a malformed answer fails before any process
    if not (isinstance(first, tuple) and len(first) == 2 and all(is_int(x) for x in first)):
        return False, f"return a tuple of two integers (start, stop), got {first!r}."
    results = run(_bounds_rank, world, fn, SIZES, device="cpu", threads=1)
    for numel in SIZES:
        problem = _problem(numel, world, [r[numel]["bounds"] for r in results])
        if problem:
            return False, problem
        if not all(r[numel]["rebuilt"] for r in results):
            return False, f"with numel={numel}, all-gathering the shards did not rebuild the buffer."
    return True, (f"on {world} real ranks your shards equal torch.chunk's pieces for "
                  f"{len(SIZES)} buffer sizes, and all-gathering them rebuilt every buffer.")


def _fsdp_unit_rank(pre_forward: Callable, post_backward: Callable, steps: int) -> dict:
    """On each rank: train with the learner's unit hooks, then with ``fully_shard``; count bytes."""
    unit = type("YourUnit", (FSDPUnit,), {"pre_forward": pre_forward, "post_backward": post_backward})
    wrapper = type("YourFSDP", (FSDPByHand,), {"unit_class": unit})
    config = get_config("tiny").replace(bias=False)   # no exactly-zero gradients (rounding noise)
    mine = train_fsdp_rank(wrapper, config, steps=steps, optimizer="adam")
    theirs = train_torch_fsdp_rank(config, steps=steps, optimizer="adam")
    return {"mine": mine, "theirs": theirs["params"], "bytes": mine["comm"],
            "torch_bytes": theirs["comm"]}


def check_fsdp_unit(pre_forward: Callable, post_backward: Callable, world: int = 2,
                    steps: int = 2) -> tuple[bool, str]:
    """Run FSDP by hand with the learner's ``pre_forward(unit)`` and ``post_backward(unit)`` on
    ``world`` real ranks for ``steps`` Adam steps; compare with ``fully_shard``."""
    for fn, name in ((pre_forward, "pre_forward"), (post_backward, "post_backward")):
        if not callable(fn):
            raise TypeError(f"pass your function itself ({name}, no parentheses), "
                            f"got {type(fn).__name__}")
    if not is_int(world) or world < 2:
        raise ValueError(f"world must be an integer >= 2, got {world!r}")
    result = run(_fsdp_unit_rank, world, pre_forward, post_backward, steps, device="cpu", threads=1)[0]
    mine, theirs = result["mine"], result["theirs"]
    if set(result["bytes"]) != set(result["torch_bytes"]):
        extra = sorted(set(result["bytes"]) - set(result["torch_bytes"]))
        return False, (f"your units called {sorted(result['bytes'])}, fully_shard "
                       f"{sorted(result['torch_bytes'])}" + (f": {extra} sends more than needed "
                       "(every rank receives the whole sum, but keeps only its shard)" if extra else ""))
    if mine["full_bytes_after_backward"]:
        return False, (f"after backward your units still hold {mine['full_bytes_after_backward']:,} "
                       "bytes of full parameters or gradients: free them once the gradient is "
                       "reduce-scattered (full.grad = None, and the storage resized to 0).")
    diff = max((mine["params"][k] - theirs[k]).abs().max().item() for k in theirs)
    if not diff <= 1e-5:
        return False, (f"after {steps} steps your weights differ from fully_shard's by up to "
                       f"{diff:.2e}: is the shard's gradient the average over the ranks, and "
                       "the right piece of it?")
    if result["bytes"] != result["torch_bytes"]:
        return False, (f"same weights, but your collectives moved {result['bytes']} bytes where "
                       f"fully_shard moved {result['torch_bytes']}.")
    return True, (f"on {world} real ranks your units trained the tiny GPT to fully_shard's weights "
                  f"(within {diff:.1e}) with the same bytes per collective {result['bytes']}, and "
                  "held no full parameters after backward.")


def _full_state_dict_rank(fn: Callable, steps: int) -> dict:
    """On each rank: FSDP by hand trained ``steps`` Adam steps; the learner's gather and ours."""
    rank, world = dist.get_rank(), dist.get_world_size()
    config = get_config("tiny")
    torch.manual_seed(0)
    model = FSDPByHand(GPT(config))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):                     # the shards move away from their initial values
        inputs, targets = get_batch(2, 16, seed=0, step=step, rank=rank, world_size=world)
        optimizer.zero_grad()
        GPT.loss(model(inputs), targets).backward()
        optimizer.step()
    mine = fn(model)
    return {"mine": {k: v.detach().clone() for k, v in mine.items()} if isinstance(mine, dict)
            else mine, "ours": fsdp_full_state_dict(model)}


def check_full_state_dict(fn: Callable, world: int = 2, steps: int = 2) -> tuple[bool, str]:
    """Run the learner's ``fn(model)`` (``model``: an :class:`FSDPByHand`) on ``world`` real ranks
    after ``steps`` training steps; compare every rank's answer with ``fsdp_full_state_dict``."""
    if not callable(fn):
        raise TypeError(f"pass your function itself (full_state_dict, no parentheses), "
                        f"got {type(fn).__name__}")
    if not is_int(world) or world < 2:
        raise ValueError(f"world must be an integer >= 2, got {world!r}")
    for rank, result in enumerate(run(_full_state_dict_rank, world, fn, steps, device="cpu",
                                      threads=1)):
        mine, ours = result["mine"], result["ours"]
        if not isinstance(mine, dict) or not all(torch.is_tensor(v) for v in mine.values()):
            return False, f"return a dict {{name: tensor}}, got {type(mine).__name__} on rank {rank}."
        if set(mine) != set(ours):
            missing, extra = sorted(set(ours) - set(mine)), sorted(set(mine) - set(ours))
            return False, (f"rank {rank}'s names differ: missing {missing[:3]}, extra {extra[:3]} "
                           "(the wrapped module's names, as unit.names gives them).")
        for name, want in ours.items():
            got = mine[name]
            if got.shape != want.shape:
                return False, (f"on rank {rank} {name} has shape {tuple(got.shape)}, the parameter "
                               f"{tuple(want.shape)}: did you gather every rank's shard before "
                               "cutting it, and view each piece in its parameter's shape?")
            if not torch.equal(got, want):
                return False, (f"on rank {rank} {name} has the right shape but not the trained "
                               "values: are the shards gathered in rank order, and each piece cut "
                               "at its parameter's offset?")
    return True, (f"on {world} real ranks your gather rebuilt all {len(ours)} full parameters of the "
                  f"trained model, equal to the library's, on every rank.")
