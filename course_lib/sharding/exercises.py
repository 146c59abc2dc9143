"""Chapter 3's code exercises, run on real ranks: ``shard_bounds`` and FSDP's unit hooks.

:func:`check_shard_bounds` runs the learner's function on ``world`` real ranks for a few buffer
sizes (one smaller than the world, a few that do not divide, the tiny GPT's Ψ), all-gathers
every rank's shard as ZeRO all-gathers parameters, and compares the bounds with
``torch.chunk``'s pieces — the rule of :func:`course_lib.sharding.zero_by_hand.shard_bounds`
and of FSDP2. The message says what is off (a gap, an overlap, past the end, unequal shares)
without the formula (for ``course_lib.check_true``). :func:`check_fsdp_unit` plugs the learner's
``pre_forward(unit)`` / ``post_backward(unit)`` into :class:`~course_lib.sharding.fsdp_by_hand.
FSDPByHand`, trains the tiny GPT on 2 ranks next to torch's ``fully_shard`` and compares the
weights, the bytes per collective type and what the units still hold after backward.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from course_lib.common.checks import is_int
from course_lib.common.models import get_config, param_count
from course_lib.launcher.launch import run
from course_lib.sharding.fsdp_by_hand import FSDPByHand, FSDPUnit
from course_lib.sharding.hand_measure import train_fsdp_rank, train_torch_fsdp_rank

__all__ = ["check_shard_bounds", "check_fsdp_unit", "SIZES"]

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
