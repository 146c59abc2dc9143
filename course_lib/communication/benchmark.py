"""Collective benchmarks in the style of nccl-tests: time, algbw and busbw (chapter 5).

For each collective and message size ``S`` (bytes) every rank runs the operation ``iters`` times
back to back; the time per operation is averaged over the ranks (nccl-tests' default, ``-a 1``).
As nccl-tests defines them (``doc/PERFORMANCE.md``): ``algbw = S / t`` and
``busbw = algbw * factor``, ``factor`` being ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for
all-gather, reduce-scatter and all-to-all, ``1`` for broadcast and reduce. ``S`` is the full
buffer: the all-gather's *output*, the reduce-scatter's *input*. ``MORE_COLLECTIVES`` (reduce,
all_to_all) are measured on request. :func:`memcopy_bandwidth` measures one process copying
memory: the ceiling to read busbw against on one machine. gloo on CPU here; NCCL on GPUs
through :func:`course_lib.run`'s auto-detection.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.distributed as dist

from course_lib.common.checks import is_int
from course_lib.launcher import devices
from course_lib.launcher.launch import run
from course_lib.memory.report import byte_unit

__all__ = ["COLLECTIVES", "MORE_COLLECTIVES", "CollectiveResult", "busbw_factor", "benchmark_collectives",
           "bench_rank", "memcopy_bandwidth", "format_table", "size_label", "power_sizes",
           "validate_request"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
MORE_COLLECTIVES = ("reduce", "all_to_all")
#: Interactive defaults: five sizes from 1 KiB to 16 MiB (a couple of seconds on 2 ranks).
DEFAULT_SIZES = (2**10, 2**14, 2**18, 2**22, 2**24)
_ELEMENT = 4  # bytes per float32 element


def busbw_factor(collective: str, world: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor."""
    validate_request([collective], [1], world, min_world=1)
    if collective == "all_reduce":
        return 2 * (world - 1) / world
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (world - 1) / world
    return 1.0


@dataclass(frozen=True)
class CollectiveResult:
    """One measured point: ``collective`` on ``world`` ranks moving a ``size_bytes`` buffer."""

    collective: str
    world: int
    size_bytes: int
    seconds: float  # mean time per operation (mean over ranks of each rank's average)
    iters: int
    backend: str

    @property
    def algbw(self) -> float:
        """Algorithm bandwidth in GB/s (1 GB = 1e9 bytes, as nccl-tests)."""
        return self.size_bytes / self.seconds / 1e9

    @property
    def busbw(self) -> float:
        """Bus bandwidth in GB/s: algbw times :func:`busbw_factor`."""
        return self.algbw * busbw_factor(self.collective, self.world)


def size_label(nbytes: int) -> str:
    """``1048576`` -> ``'1 MiB'``: the power-of-two unit that keeps the number small."""
    unit, scale = byte_unit(nbytes)
    value = nbytes / scale
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"


def power_sizes(smallest: int = 2**10, largest: int = 2**28, step: int = 4) -> list[int]:
    """Sizes ``smallest, smallest*step, ...`` up to ``largest`` (nccl-tests' ``-b -e -f``)."""
    if smallest <= 0 or largest < smallest or step < 2:
        raise ValueError(f"need 0 < smallest <= largest and step >= 2, got "
                         f"{smallest}, {largest}, {step}")
    sizes = [smallest]
    while sizes[-1] * step <= largest:
        sizes.append(sizes[-1] * step)
    return sizes


def validate_request(collectives: Iterable[str], sizes: Iterable[int], world: int,
                     min_world: int = 2) -> None:
    """Raise ``ValueError`` for an unknown collective, a size <= 0 or too few ranks."""
    for name in collectives:
        if name not in COLLECTIVES + MORE_COLLECTIVES:
            raise ValueError(f"unknown collective {name!r}; choose from "
                             f"{COLLECTIVES + MORE_COLLECTIVES}")
    for size in sizes:
        if not is_int(size) or size <= 0:
            raise ValueError(f"message sizes must be positive integers (bytes), got {size!r}")
    if not is_int(world) or world < min_world:
        raise ValueError(f"world size must be an integer >= {min_world}, got {world!r}")


def _iters_for(size: int) -> int:
    """Fewer repetitions for big messages: 20 up to 2 MiB, then fewer, 2 from 32 MiB on."""
    return max(2, min(20, 2**26 // max(size, 1)))


def bench_rank(collectives: Sequence[str], sizes: Sequence[int], iters: int | None,
               warmup: int) -> list[tuple[str, int, float, int]]:
    """Executed on every rank: time each (collective, size); return (name, bytes, s, iters)."""
    world = dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = []
    for name in collectives:
        for size in sizes:
            count = max(size // _ELEMENT, 1)
            if name in ("all_gather", "reduce_scatter", "all_to_all"):
                count = max(world, count - count % world)  # each rank holds count / world
            full = torch.ones(count, device=device)
            part = torch.ones(count // world, device=device)
            received = torch.empty_like(full) if name == "all_to_all" else None
            op = {"all_reduce": lambda: dist.all_reduce(full),
                  "all_gather": lambda: dist.all_gather_single(full, part),
                  "reduce_scatter": lambda: dist.reduce_scatter_single(part, full),
                  "broadcast": lambda: dist.broadcast(full, src=0),
                  "reduce": lambda: dist.reduce(full, dst=0),
                  "all_to_all": lambda: dist.all_to_all_single(received, full)}[name]
            n = iters or _iters_for(size)
            for _ in range(warmup):
                op()
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(n):
                op()
            sync()
            mine = torch.tensor([(time.perf_counter() - start) / n], dtype=torch.float64,
                                device=device)
            dist.all_reduce(mine)  # sum of the ranks' times; divided by world below
            results.append((name, count * _ELEMENT, mine.item() / world, n))
    return results


def benchmark_collectives(collectives: Sequence[str] = COLLECTIVES,
                          sizes: Sequence[int] = DEFAULT_SIZES, world: int = 2,
                          iters: int | None = None, warmup: int = 1,
                          timeout: float = 300.0) -> list[CollectiveResult]:
    """Measure each collective at each size on ``world`` real processes.

    ``iters=None`` picks fewer repetitions for larger messages (see ``_iters_for``). Bad input
    fails here, before any process starts.
    """
    collectives, sizes = list(collectives), list(sizes)
    validate_request(collectives, sizes, world)
    if iters is not None and (not is_int(iters) or iters < 1):
        raise ValueError(f"iters must be a positive integer or None, got {iters!r}")
    backend = devices.place(world).backend
    per_rank = run(bench_rank, world, collectives, sizes, iters, warmup, timeout=timeout)
    return [CollectiveResult(name, world, nbytes, seconds, n, backend)
            for name, nbytes, seconds, n in per_rank[0]]


def memcopy_bandwidth(size_bytes: int = 2**28, repeats: int = 5) -> float:
    """GB/s of ``dst.copy_(src)`` in this one process (bytes copied / time, best of repeats).

    No transfer between two processes on the same machine moves bytes faster than one process
    copies them, so this is the ceiling for gloo's busbw here (86-106 GB/s for sizes that fit in
    cache, ~20 GB/s from main memory on the course's 2-core machine).
    """
    if size_bytes <= 0 or repeats < 1:
        raise ValueError(f"need size_bytes > 0 and repeats >= 1, got {size_bytes}, {repeats}")
    src = torch.ones(max(size_bytes // _ELEMENT, 1))
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages once
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return src.numel() * _ELEMENT / min(times) / 1e9


def format_table(rows: Sequence[CollectiveResult], ceiling_gbps: float | None = None) -> str:
    """The rows as an nccl-tests-like text table (one line per point)."""
    lines = [f"{'collective':<15}{'ranks':>6}{'size':>11}{'time':>12}{'algbw':>12}{'busbw':>12}",
             f"{'':<15}{'':>6}{'':>11}{'(ms)':>12}{'(GB/s)':>12}{'(GB/s)':>12}"]
    for row in rows:
        lines.append(f"{row.collective:<15}{row.world:>6}{size_label(row.size_bytes):>11}"
                     f"{row.seconds * 1e3:>12.3f}{row.algbw:>12.4f}{row.busbw:>12.4f}")
    if ceiling_gbps is not None:
        lines.append(f"ceiling: one process copies memory at {ceiling_gbps:.1f} GB/s")
    return "\n".join(lines)
