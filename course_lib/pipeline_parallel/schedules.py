"""Pipeline parallelism by hand: stages, GPipe and 1F1B with send/recv (chapter 4).

The GPT's blocks are cut into ``p`` consecutive **stages**, one per process (the first also owns
the embeddings, the last ``ln_f``, ``lm_head`` and the loss); a batch is cut into ``m``
**micro-batches**. **GPipe**: every forward, then every backward; each stage keeps all ``m``
micro-batches' activations. **1F1B**: after ``p - rank - 1`` warm-up forwards a stage
alternates one forward and one backward, holding at most ``p - rank``. Both have the same
**bubble**, ``(p-1)/(m+p-1)`` of the step when all micro-batches cost the same.
:func:`run_schedule` is the plain loop, :class:`StageSteps` one micro-batch's receive, forward
and backward (timed from outside by :mod:`~course_lib.pipeline_parallel.trace`); sends are
``isend`` (a blocking one deadlocks 1F1B), the next receive is posted before each compute.
:func:`lay_out` places the actions on an ideal machine.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from course_lib.common.checks import positive_int
from course_lib.common.deprecation import renamed
from course_lib.common.models import GPT, GPTConfig, Stage  # Stage: re-exported

__all__ = ["Stage", "validate_pipeline", "schedule_ops", "SCHEDULES", "StageSteps",
           "run_schedule", "lay_out"]

SCHEDULES = ("gpipe", "1f1b")


def validate_pipeline(config: GPTConfig, p: int, m: int, batch: int | None = None,
                      schedule: str = "gpipe") -> None:
    """Raise ``ValueError`` for a pipeline that cannot be built (before any process starts)."""
    for name, value in (("p (stages)", p), ("m (micro-batches)", m), ("batch", 1 if batch is None else batch)):
        positive_int(value, f"{name}")
    if config.n_layer % p:
        raise ValueError(f"p={p} stages do not divide n_layer={config.n_layer}: every stage "
                         f"must get the same number of blocks")
    if batch is not None and batch % m:
        raise ValueError(f"m={m} micro-batches do not divide batch={batch}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


__getattr__ = renamed(__name__, {"check_pipeline": "validate_pipeline"})  # before issue 32


def schedule_ops(schedule: str, p: int, m: int, rank: int) -> list[tuple[str, int]]:
    """The order in which stage ``rank`` runs forwards ("F", i) and backwards ("B", i)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - rank - 1, m)
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):              # steady state: one forward, one backward
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warmup, m)]   # cool-down


def lay_out(orders: list, cost: Callable[[int, str, int], float]) -> list:
    """Each rank's actions in its order (``orders[rank]``), each taking ``cost(rank, kind, i)``
    and starting as soon as the rank is free and its inputs exist (``F i`` after ``F i`` on rank
    r-1; ``B i`` after this rank's ``F i`` and ``B i`` on rank r+1), messages taking no time:
    ``[(rank, kind, i, start, end)]``. ``ValueError`` names where orders wait on each other."""
    p = len(orders)
    done, free, nxt, events = {}, [0.0] * p, [0] * p, []
    while any(nxt[r] < len(orders[r]) for r in range(p)):
        moved = False
        for rank in range(p):
            while nxt[rank] < len(orders[rank]):
                kind, i = orders[rank][nxt[rank]]
                needs = [("F", i, rank - 1)] if kind == "F" and rank else []
                if kind == "B":
                    needs = [("F", i, rank)] + ([("B", i, rank + 1)] if rank < p - 1 else [])
                if not all(n in done for n in needs):
                    break
                start = max([free[rank]] + [done[n] for n in needs])
                done[kind, i, rank] = free[rank] = start + cost(rank, kind, i)
                events.append((rank, kind, i, start, free[rank]))
                nxt[rank] += 1
                moved = True
        if not moved:
            stuck = [f"rank {r} waits before {orders[r][nxt[r]]}" for r in range(p)
                     if nxt[r] < len(orders[r])]
            raise ValueError("this order deadlocks: " + "; ".join(stuck))
    return events


class StageSteps:
    """What one stage does for one micro-batch: receive, forward, backward.

    :func:`run_schedule` decides *when* each happens; this class does it. The chapter's
    measurements subclass it and time every call from outside
    (:class:`~course_lib.pipeline_parallel.trace.TracedSteps`); ``kind`` and ``i`` are for them.
    """

    def __init__(self, stage: Stage, micro_targets: list) -> None:
        self.stage, self.targets = stage, micro_targets
        self.posted: dict = {}               # (kind, i) -> (buffer, the irecv's work)

    def post(self, kind: str, i: int, shape: tuple[int, ...], src: int) -> None:
        """Start receiving the activation (``kind`` "F") or gradient ("B") of micro-batch ``i``."""
        x = torch.empty(shape)
        self.posted[(kind, i)] = (x, dist.irecv(x, src=src))

    def recv(self, kind: str, i: int, shape: tuple[int, ...], src: int) -> torch.Tensor:
        """That tensor, from ``src``, once it has arrived (posting its receive first if needed)."""
        if (kind, i) not in self.posted:
            self.post(kind, i, shape, src)
        x, work = self.posted.pop((kind, i))
        work.wait()                          # blocks: waiting here is idle time
        return x

    def forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """This stage's output for micro-batch ``i``; on the last stage, its loss scaled by 1/m."""
        y = self.stage(x)
        return GPT.loss(y, self.targets[i]) / len(self.targets) if self.stage.last else y

    def backward(self, i: int, y: torch.Tensor, grad: torch.Tensor | None) -> None:
        """Backpropagate micro-batch ``i`` from ``y`` (``grad``: dLoss/dy, None for a loss)."""
        torch.autograd.backward(y, grad)


def run_schedule(steps: StageSteps, schedule: str, micro_inputs: list, act_shape: tuple[int, ...],
                 ops: Callable[[str, int, int, int], list] = schedule_ops) -> float | None:
    """Run one training step of ``schedule`` on this rank; the last stage returns its loss.

    ``steps`` receives and computes (:class:`StageSteps`); ``micro_inputs`` are used by the first
    stage only; ``act_shape`` is the shape of the activations passed between stages. Gradients
    accumulate in the stage's parameters (the loss of each micro-batch is scaled by ``1/m``, so
    they equal the full batch's). ``ops(schedule, p, m, rank)`` gives the order
    (:func:`schedule_ops`, or a notebook's copy).
    """
    stage, rank, p = steps.stage, dist.get_rank(), dist.get_world_size()
    order = ops(schedule, p, len(micro_inputs), rank)
    peer = {"F": None if stage.first else rank - 1, "B": None if stage.last else rank + 1}
    receives = [(k, i) for k, i in order if peer[k] is not None]   # this rank's, in order
    stash, sends, losses, taken = {}, [], [], 0   # stash: micro-batch -> (input, output)
    for kind, i in order:
        got = None if peer[kind] is None else steps.recv(kind, i, act_shape, peer[kind])
        taken += got is not None
        if taken < len(receives) and receives[taken] not in steps.posted:   # the next one, now
            steps.post(*receives[taken], act_shape, peer[receives[taken][0]])
        if kind == "F":
            x = micro_inputs[i] if stage.first else got.requires_grad_()
            y = steps.forward(i, x)
            if stage.last:
                losses.append(y.item())
            else:                            # keep y alive until its send is done
                sends.append((dist.isend(y.detach(), dst=rank + 1), y))
            stash[i] = (x, y)
        else:
            x, y = stash.pop(i)
            steps.backward(i, y, got)        # got: dLoss/dy from the next stage (None: a loss)
            if not stage.first:
                sends.append((dist.isend(x.grad, dst=rank - 1), x))
    for work, _ in sends:
        work.wait()
    return sum(losses) if stage.last else None
