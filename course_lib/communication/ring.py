"""Ring all-reduce written by hand: reduce-scatter, then all-gather (chapter 5).

The algorithm behind DDP's gradient averaging (NCCL's ring; Patarasuk & Yuan, JPDC 2009). The
``p`` ranks stand in a circle, each sending only to its right neighbour and receiving from its
left; the tensor is cut into ``p`` chunks. Reduce-scatter, ``p-1`` steps: in step ``s`` rank
``r`` sends chunk ``r-s`` and adds the chunk ``r-s-1`` it receives to its own copy, ending with
the complete sum of chunk ``r+1``. All-gather, ``p-1`` steps: the finished chunks travel once
more around the ring. Each rank sends ``2(p-1)`` messages of ``n/p`` bytes, ``2(p-1)/p * n`` in
all, almost independent of ``p``: why the ring scales, and where the α-β model
(:mod:`course_lib.communication.alphabeta`) comes from. Tests check it against
``dist.all_reduce`` for world sizes 2-4 and sizes not divisible by ``p``.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from course_lib.communication.benchmark import validate_request
from course_lib.data_parallel.ddp_internals import bytes_written
from course_lib.launcher.launch import run

__all__ = ["ring_reduce_scatter", "ring_all_gather", "ring_all_reduce", "compare_ring",
           "ring_traffic", "ring_steps"]


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int) -> None:
    """Send ``send`` to the right neighbour while receiving ``recv`` from the left one.

    Both at once (isend/irecv): with blocking sends every rank would wait for its right
    neighbour to receive, and all of them would wait forever. Empty chunks (a tensor with fewer
    elements than ranks) are skipped on both sides, which agree on the chunk sizes.
    """
    requests = []
    if send.numel():
        requests.append(dist.isend(send, right))
    if recv.numel():
        requests.append(dist.irecv(recv, left))
    for request in requests:
        request.wait()


def ring_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter in place: afterwards chunk ``(r+1) % p`` of rank r is the sum; return it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    chunks = tensor.view(-1).tensor_split(world)   # p views; sizes differ by at most 1
    incoming = torch.empty_like(chunks[0])         # chunk 0 is the largest
    for step in range(world - 1):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        buffer = incoming[:chunks[recv].numel()]
        _exchange(chunks[send], buffer, right, left)
        chunks[recv].add_(buffer)                  # now the sum of step+2 ranks' values
    return chunks[(rank + 1) % world]


def ring_all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """All-gather in place: rank r starts with chunk ``(r+1) % p`` complete, ends with all of them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    chunks = tensor.view(-1).tensor_split(world)
    for step in range(world - 1):                  # pass the complete chunks on, overwriting
        send, recv = (rank + 1 - step) % world, (rank - step) % world
        _exchange(chunks[send], chunks[recv], right, left)
    return tensor


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place with a ring; return it (like ``dist.all_reduce``)."""
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce needs a contiguous tensor (chunks are views of it)")
    ring_reduce_scatter(tensor)
    return ring_all_gather(tensor)


def _compare_rank(sizes: Sequence[int], iters: int,
                  ring: Callable | None = None) -> list[tuple[int, float, float, float]]:
    """On every rank: (bytes, ring seconds, dist.all_reduce seconds, max abs difference)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for size in sizes:
        count = max(size // 4, 1)
        data = torch.randn(count, generator=torch.Generator().manual_seed(rank))
        times = {}
        for name, fn in (("ring", ring or ring_all_reduce), ("torch", dist.all_reduce)):
            buf = data.clone()
            fn(buf)  # warm-up, and the result to compare
            times[name + "_result"] = buf
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                fn(data.clone())
            elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
            dist.all_reduce(elapsed)
            times[name] = elapsed.item() / world
        diff = (times["ring_result"] - times["torch_result"]).abs().max().item()
        out.append((count * 4, times["ring"], times["torch"], diff))
    return out


def compare_ring(sizes: Sequence[int] = (2**12, 2**16, 2**20, 2**23), world: int = 2,
                 iters: int = 5, ring: Callable | None = None) -> list[dict]:
    """Time the hand-written ring against ``dist.all_reduce`` (mean over ranks, seconds).

    Each dict has ``bytes``, ``ring_s``, ``torch_s`` and ``max_abs_diff`` (float32 sums in a
    different order differ by rounding only). The copy of the input made per iteration is
    timed for both, so it does not favour either. ``ring`` replaces :func:`ring_all_reduce`
    (e.g. a notebook cell's edited copy).
    """
    validate_request(["all_reduce"], list(sizes), world)
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    rows = run(_compare_rank, world, list(sizes), iters, ring)[0]
    return [{"bytes": b, "ring_s": r, "torch_s": t, "max_abs_diff": d} for b, r, t, d in rows]


def _traffic_rank(ring: Callable, count: int) -> dict:
    """On every rank: bytes written to the sockets during ``ring``, and its result vs gloo's."""
    rank = dist.get_rank()
    data = torch.randn(count, generator=torch.Generator().manual_seed(rank))
    mine, theirs = data.clone(), data.clone()
    dist.all_reduce(theirs)
    dist.barrier()
    before = bytes_written()
    ring(mine)
    after = bytes_written()
    equal = torch.allclose(mine, theirs, rtol=1e-5, atol=1e-5)  # float32 sums in another order
    return {"sent": None if before is None else after - before, "equal": equal}


def ring_traffic(worlds: Sequence[int] = (2, 3, 4), size: int = 2**22,
                 ring: Callable | None = None) -> list[dict]:
    """Run ``ring`` (default :func:`ring_all_reduce`) on each world size; what each rank sent.

    Per world a dict: ``world``, ``bytes`` (S), ``sent`` (per rank: bytes it wrote to its
    sockets during the call, ``wchar`` of ``/proc/self/io``; None off Linux), ``formula``
    (``2(p-1)/p · S``) and ``equal`` (per rank: the result equals ``dist.all_reduce``'s).
    """
    worlds = list(worlds)
    if not worlds:
        raise ValueError("worlds must name at least one world size")
    for world in worlds:  # every request is checked before any process starts
        validate_request(["all_reduce"], [size], world)
    rows = []
    for world in worlds:
        per_rank = run(_traffic_rank, world, ring or ring_all_reduce, max(size // 4, 1), threads=1)
        rows.append({"world": world, "bytes": size, "sent": [r["sent"] for r in per_rank],
                     "formula": 2 * (world - 1) / world * size,
                     "equal": [r["equal"] for r in per_rank]})
    return rows


def _steps_rank(ring: Callable, per_chunk: int) -> list[dict]:
    """On every rank: run ``ring`` on ``2**rank`` everywhere, recording each ``dist.isend``:
    which chunk of the tensor it sends (from the view's offset), to whom, and the ranks whose
    values it already holds (the bits of the float sum: exact up to 24 ranks)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((per_chunk * world,), float(2 ** rank))
    base, size = tensor.data_ptr(), tensor.element_size()
    sends, isend = [], dist.isend

    def recorded(t, dst, *args, **kwargs):
        offset = (t.data_ptr() - base) // size
        inside = 0 <= offset < tensor.numel() and offset % per_chunk == 0
        bits = int(t.view(-1)[0].item())
        sends.append({"step": len(sends) + 1, "src": rank, "dst": dst,
                      "chunk": offset // per_chunk if inside else None,
                      "ranks": [r for r in range(world) if bits >> r & 1]})
        return isend(t, dst, *args, **kwargs)

    dist.isend = recorded
    try:
        ring(tensor)
    finally:
        dist.isend = isend
    if not torch.equal(tensor, torch.full_like(tensor, float(2 ** world - 1))):
        raise AssertionError(f"rank {rank}: the ring's result is not the sum of every rank")
    return sends


def ring_steps(world: int = 4, ring: Callable | None = None, per_chunk: int = 2) -> list[dict]:
    """Run ``ring`` (default :func:`ring_all_reduce`) on ``world`` real ranks and return every
    message it sent, as recorded by the ranks: ``step``, ``src``, ``dst``, ``chunk`` (index of
    the chunk sent) and ``ranks`` (whose values the chunk held when it left), sorted by step."""
    validate_request(["all_reduce"], [4 * per_chunk * world], world)
    if not 2 <= world <= 24:
        raise ValueError(f"ring_steps needs 2 to 24 ranks, got {world}")
    per_rank = run(_steps_rank, world, ring or ring_all_reduce, per_chunk, threads=1)
    return sorted((m for sends in per_rank for m in sends), key=lambda m: (m["step"], m["src"]))
