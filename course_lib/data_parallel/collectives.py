"""The five collectives of data parallelism, run for real and shown before/after (chapter 2).

:func:`show_collectives` runs each collective on ``world`` real processes
(:func:`course_lib.run`) and returns what every rank held **before** and **after** the call, as
``torch.distributed`` returned it; :func:`format_collectives` prints that as a table. Rank ``r``
starts with ``[10r, 10r+1, …]`` so a number tells where it came from (``21``: element 1 of rank
2). By default ``broadcast``, ``all_reduce``, ``all_gather``, ``reduce_scatter`` and
``barrier`` (rank ``r`` sleeps ``r × 50 ms`` first; every rank records when it left);
``names=MORE_COLLECTIVES`` adds ``reduce`` and ``all_to_all``. Chapter 2 says where each is used
(DDP, ZeRO, FSDP, expert parallelism); :func:`course_lib.data_parallel.show.plot_collectives`
draws who sends what to whom.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_lib.common.checks import is_int
from course_lib.launcher import devices
from course_lib.launcher.launch import run

__all__ = ["DEMO_COLLECTIVES", "MORE_COLLECTIVES", "CollectiveDemo", "show_collectives",
           "format_collectives"]

DEMO_COLLECTIVES = ("broadcast", "all_reduce", "all_gather", "reduce_scatter", "barrier")
MORE_COLLECTIVES = ("reduce", "all_to_all")
_BARRIER_DELAY_S = 0.05


@dataclass(frozen=True)
class CollectiveDemo:
    """One collective on ``world`` ranks: each rank's tensor before and after (as lists).

    For ``barrier``, ``before`` is ``[planned delay, arrival time]`` and ``after`` ``[leaving
    time]`` per rank, the times read from the machine-wide monotonic clock (all ranks of ``run``
    share one machine, so their clocks agree); ``left_together`` says whether every rank left
    after the last one arrived.
    """

    name: str
    world: int
    before: list[list[float]]
    after: list[list[float]]

    @property
    def left_together(self) -> bool:
        if self.name != "barrier":
            raise AttributeError("left_together is only defined for the barrier")
        last_arrival = max(b[1] for b in self.before)
        return all(a[0] >= last_arrival for a in self.after)


def _start(rank: int, world: int, width: int) -> torch.Tensor:
    """Rank ``r``'s tensor ``[10r, 10r+1, ...]``: its values say where they came from.

    On this rank's GPU under NCCL (which only moves CUDA tensors), else on the CPU (gloo)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    return torch.arange(width, dtype=torch.float32, device=device) + 10 * rank


def _rank_demo(names: list[str]) -> dict[str, tuple[list[float], list[float]]]:
    """On each rank: run each collective and return ``{name: (before, after)}``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for name in names:
        if name == "barrier":  # arrive at different times, leave together
            dist.barrier()                                 # line everybody up first
            delay = rank * _BARRIER_DELAY_S
            time.sleep(delay)
            arrived = time.monotonic()  # one clock for every process of this machine
            dist.barrier()
            out[name] = ([delay, arrived], [time.monotonic()])
            continue
        # all_gather: each rank holds 2 numbers and receives 2 per rank; the others hold one
        # element per rank (reduce_scatter, all_to_all: element j is for rank j)
        x = _start(rank, world, 2 if name == "all_gather" else world)
        before = x.tolist()
        if name == "broadcast":
            dist.broadcast(x, src=0)
        elif name == "all_reduce":
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        elif name == "reduce":
            dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)
            x = x if rank == 0 else x[:0]                  # undefined on the other ranks
        elif name == "all_gather":
            x, piece = x.new_empty(2 * world), x
            dist.all_gather_single(x, piece)
        elif name == "reduce_scatter":
            x, full = x.new_empty(1), x
            dist.reduce_scatter_single(x, full, op=dist.ReduceOp.SUM)
        else:  # all_to_all
            x, sent = x.new_empty(world), x
            dist.all_to_all_single(x, sent)
        out[name] = (before, x.tolist())
    return out


def show_collectives(world: int = 4, names: tuple[str, ...] = DEMO_COLLECTIVES
                     ) -> list[CollectiveDemo]:
    """Run each collective in ``names`` on ``world`` real ranks; return their before/after."""
    unknown = [n for n in names if n not in DEMO_COLLECTIVES + MORE_COLLECTIVES]
    if unknown:
        raise ValueError(f"unknown collective(s) {unknown}; choose from "
                         f"{DEMO_COLLECTIVES + MORE_COLLECTIVES}")
    if not is_int(world) or world < 2:
        raise ValueError(f"world must be an integer >= 2 (a collective needs partners), "
                         f"got {world!r}")
    devices.place(world)  # too many ranks for this machine fails here, before any process starts
    per_rank = run(_rank_demo, world, list(names))
    return [CollectiveDemo(name, world, [r[name][0] for r in per_rank],
                           [r[name][1] for r in per_rank]) for name in names]


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def format_collectives(demos: list[CollectiveDemo]) -> str:
    """A deterministic text table: one block per collective, one line per rank.

    The barrier's times vary from run to run, so the table shows what is certain: each rank's
    planned delay, and whether all ranks left after the last arrival.
    """
    lines = []
    for demo in demos:
        lines.append(f"{demo.name} on {demo.world} ranks")
        if demo.name == "barrier":
            for rank, before in enumerate(demo.before):
                lines.append(f"  rank {rank}: arrives after {before[0] * 1e3:.0f} ms")
            lines.append(f"  every rank left after the last arrival: {demo.left_together}")
            continue
        width = max(len(_fmt(b)) for b in demo.before)
        for rank, (before, after) in enumerate(zip(demo.before, demo.after)):
            shown = _fmt(after) if after else "(not defined: only rank 0 receives)"
            lines.append(f"  rank {rank}: {_fmt(before):<{width}}  ->  {shown}")
    return "\n".join(lines)
