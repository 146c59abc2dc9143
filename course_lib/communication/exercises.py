"""Chapter 5's code exercise: a learner's ring reduce-scatter, run on real ranks.

:func:`check_reduce_scatter` runs ``reduce_scatter(tensor)`` on 3 real ranks and holds chunk
``r`` of rank ``r`` against ``dist.all_reduce``'s result (torch's convention: rank r owns chunk
r, as ``dist.reduce_scatter_tensor`` leaves it). A ring whose sends and receives do not match
waits forever; each rank therefore runs the learner's function in a thread and gives up after
``patience`` seconds (a working ring needs milliseconds here), so the check says "deadlock"
in seconds instead of hanging the notebook.
"""
from __future__ import annotations

import itertools
import threading
from typing import Callable

import torch
import torch.distributed as dist

from course_lib.launcher.launch import run
from course_lib.exercises import Feedback, check_choice, check_number
from course_lib.communication.benchmark import busbw_factor
from course_lib.communication.formulas import ring_allreduce_time
from course_lib.communication.whatif import STRATEGIES

__all__ = ["check_reduce_scatter", "check_busbw", "check_speedup_8", "check_volume"]

N = 1003  # elements: not divisible by 3, so the chunks differ in size


def _values(world: int) -> list[torch.Tensor]:
    """Every rank's input (each rank can rebuild all of them, to name partial sums)."""
    return [torch.randn(N, generator=torch.Generator().manual_seed(100 + k)) for k in range(world)]


def _rs_rank(fn: Callable, patience: float) -> dict:
    """On each rank: dist.all_reduce for the expected sums, then the learner's function, watched."""
    rank, world = dist.get_rank(), dist.get_world_size()
    data = _values(world)[rank].clone()
    total = data.clone()
    dist.all_reduce(total)
    outcome: dict = {}

    def attempt() -> None:
        try:
            fn(data)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread below
            outcome["error"] = exc

    worker = threading.Thread(target=attempt, daemon=True)  # os._exit ends it if it hangs
    worker.start()
    worker.join(patience)
    if worker.is_alive():
        return {"hung": True}
    if "error" in outcome:
        raise outcome["error"]
    return {"hung": False, "chunks": [c.clone() for c in data.tensor_split(world)],
            "total": list(total.tensor_split(world))}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def _what_is_off(res: dict, rank: int, world: int) -> str | None:
    """Why rank ``rank``'s chunk ``rank`` is not the complete sum (None: it is)."""
    mine, total = res["chunks"], res["total"]
    if _close(mine[rank], total[rank]):
        return None
    elsewhere = [j for j in range(world) if j != rank and _close(mine[j], total[j])]
    if elsewhere:
        return (f"rank {rank} holds a complete sum, but in chunk {elsewhere[0]}, not in chunk "
                f"{rank}: your chunk indices are shifted.")
    parts = [v.tensor_split(world)[rank] for v in _values(world)]
    for size in range(1, world):
        for ranks in itertools.combinations(range(world), size):
            if _close(mine[rank], sum(parts[k] for k in ranks)):
                only = "only its own values" if ranks == (rank,) else \
                    f"the values of only {size} of the {world} ranks (ranks {list(ranks)})"
                return f"rank {rank}'s chunk {rank} holds {only}, not the sum over all ranks."
    return f"rank {rank}'s chunk {rank} differs from the sum over all ranks."


def check_reduce_scatter(fn: Callable[[torch.Tensor], object], world: int = 3,
                         patience: float = 2.0) -> tuple[bool, str]:
    """Run ``fn(tensor)`` on ``world`` real ranks; rank r's chunk r must equal the all-reduced one.

    The tensor has 1003 elements (chunks of unequal size, ``tensor_split``). Returns ``(passed,
    message)`` for :func:`course_lib.check_true`; ranks still waiting after ``patience``
    seconds are reported as a deadlock.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself (reduce_scatter, no parentheses), got "
                        f"{type(fn).__name__}")
    if not isinstance(world, int) or world < 3:
        raise ValueError(f"world must be an integer >= 3 (with 2 ranks left and right are the "
                         f"same neighbour), got {world!r}")
    results = run(_rs_rank, world, fn, patience, threads=1, timeout=60 + patience)
    hung = [rank for rank, res in enumerate(results) if res["hung"]]
    if hung:
        return False, (f"rank(s) {hung} were still waiting after {patience:g} s (a working ring "
                       "takes milliseconds here): a deadlock, each rank waiting for a message no "
                       "rank sends it. Check which neighbour each rank sends to and which one it "
                       "receives from.")
    for rank, res in enumerate(results):
        problem = _what_is_off(res, rank, world)
        if problem:
            return False, problem
    return True, (f"on {world} real ranks, chunk r of rank r equals dist.all_reduce's chunk r "
                  "on every rank.")


def check_busbw(answer) -> Feedback:
    """Exercise 1: busbw of a 256 MiB all-reduce timed at 1.1 ms on 8 GPUs (GB/s, 1 GB = 1e9 B)."""
    return check_number(answer, 2**28 / 1.1e-3 / 1e9 * busbw_factor("all_reduce", 8), rtol=0.01,
                        name="busbw", unit="GB/s",
                        hint="first the algorithm bandwidth (bytes over seconds); then the share of "
                             "it each link carries in a ring all-reduce of 8 ranks.")


def check_speedup_8(answer) -> Feedback:
    """Exercise 3: the speedup of 8 GPUs over one, step T1 = 1 s, 2 GB of gradients all-reduced
    after the compute (no overlap), ring with alpha = 5 us and 31.5 GB/s per link."""
    t8 = 1.0 / 8 + ring_allreduce_time(2e9, 8, 5e-6, 1 / 31.5e9)
    return check_number(answer, 1.0 / t8, rtol=0.02, name="speedup",
                        hint="the step on 8 GPUs is its share of the compute plus the whole all-reduce.")


def check_volume(answer) -> Feedback:
    """Exercise 4: the strategy that moves 1.5 times DDP's volume, counted as the ZeRO paper does."""
    options = ["ddp", "zero1", "zero2", "zero3"]
    volume = {s: STRATEGIES[s] / STRATEGIES["ddp"] for s in options}
    return check_choice(answer, min(volume, key=lambda s: abs(volume[s] - 1.5)), options,
                        name="volume", hint="count the collectives over the parameters/gradients in one step.")
