"""Chapter 3's code exercise: the learner's ``shard_bounds(numel, rank, world)`` on real ranks.

:func:`check_shard_bounds` runs the learner's function on ``world`` real ranks for a few buffer
sizes (one smaller than the world, a few that do not divide, the tiny GPT's Ψ), all-gathers
every rank's shard as ZeRO all-gathers parameters, and compares the bounds with
``torch.chunk``'s pieces — the rule of :func:`course_lib.sharding.zero_by_hand.shard_bounds`
and of FSDP2. The message says what is off (a gap, an overlap, past the end, unequal shares)
without the formula (for ``course_lib.check_true``).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from course_lib.common.checks import is_int
from course_lib.common.models import get_config, param_count
from course_lib.launcher.launch import run

__all__ = ["check_shard_bounds", "SIZES"]

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
