"""Chapter 10's broken runs, on real ranks: drifting weights, a NaN on one rank, a slow rank.

Each trains a small model data-parallel with one fault switched on, and returns what the
chapter's tools saw on the ranks: ``drift_run(cause)`` (torch's DDP) the first differing tensor
after each step (:mod:`.divergence`); ``nan_run`` and ``straggler_run`` average gradients by
hand (chapter 02's ``average_gradients``) and return
the is-finite flags (:mod:`.health`) and each rank's compute and step time. The faults are
real (a seed, a buffer broadcast switched off, a skipped step, a NaN in one rank's batch, a
sleep on one rank), the verdicts come from the collectives.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.data_parallel.by_hand import average_gradients
from course_lib.debugging.divergence import first_divergence
from course_lib.debugging.health import all_finite, is_finite, nonfinite_ranks, step_times
from course_lib.launcher.launch import run

__all__ = ["CAUSES", "small_model", "drift_ranks", "drift_run", "nan_run", "straggler_run"]

CAUSES = ("none", "seed", "dropout_seed", "buffer", "one_rank_step")


def small_model() -> nn.Sequential:
    """Linear → BatchNorm (buffers) → ReLU → Dropout → Linear: every way to drift, 177 weights."""
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(16, 1))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own share of the data
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def _rank_model_sgd() -> tuple[int, nn.Sequential, torch.optim.SGD]:
    """This rank, the seed-0 :func:`small_model` and its SGD (lr 0.1): how the runs here start."""
    torch.manual_seed(0)
    model = small_model()
    return dist.get_rank(), model, torch.optim.SGD(model.parameters(), lr=0.1)


def _drift_rank(cause: str, steps: int, where: str) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(rank if cause == "seed" else 0)
    # torch's DDP with its defaults: rank 0's weights and buffers broadcast when it wraps the
    # model (init_sync), rank 0's buffers broadcast again at the start of every forward
    # (forward_sync_buffers), gradients averaged during backward. Each cause turns one off.
    model = DDP(small_model(), init_sync=cause != "seed",
                forward_sync_buffers=cause != "buffer")
    if cause == "dropout_seed":
        torch.manual_seed(rank)  # same initial weights, different dropout masks
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen, stepped = [], 0
    if where == "forward":  # runs inside DDP's forward, after its buffer broadcast
        model.module.register_forward_pre_hook(
            lambda module, args: seen.append(first_divergence(module)))
    else:
        seen.append(first_divergence(model.module))
    for step in range(steps):
        x, y = _batch(step, rank)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if not (cause == "one_rank_step" and rank == 1 and step == 0):  # skipped once
            opt.step()
            stepped += 1
        if where == "after_step":
            seen.append(first_divergence(model.module))
    if where == "forward":
        with torch.no_grad():
            model(_batch(steps, rank)[0])  # one more forward: the check after the last step
    return {"seen": seen, "optimizer_steps": stepped}


def drift_ranks(cause: str = "none", steps: int = 3, nprocs: int = 2,
                where: str = "forward") -> list:
    """Every rank's ``{"seen", "optimizer_steps"}``: see :func:`drift_run`."""
    if cause not in CAUSES:
        raise ValueError(f"cause must be one of {list(CAUSES)}, got {cause!r}")
    if where not in ("forward", "after_step"):
        raise ValueError(f"where must be 'forward' or 'after_step', got {where!r}")
    return run(_drift_rank, nprocs, cause, steps, where)


def drift_run(cause: str = "none", steps: int = 3, nprocs: int = 2,
              where: str = "forward") -> list:
    """Rank 0's view: ``first_divergence`` before training and after each of ``steps`` steps
    of a model trained under torch's DDP with one fault switched on.

    ``where="forward"`` checks where DDP has synchronised: at the start of the next forward,
    after its buffer broadcast (a forward pre-hook on the wrapped module). ``"after_step"``
    checks right after ``optimizer.step()``, where each rank's BatchNorm statistics still hold
    its own batch's update even under DDP's defaults.
    """
    return drift_ranks(cause, steps, nprocs, where)[0]["seen"]


def _nan_rank(bad_rank: int, bad_step: int, steps: int, guard: bool) -> dict:
    rank, model, opt = _rank_model_sgd()
    flags = []
    for step in range(steps):
        x, y = _batch(step, rank)
        if rank == bad_rank and step == bad_step:
            x[0, 0] = float("nan")
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        if guard and not all_finite(*grads):  # every rank skips the step together
            flags.append(nonfinite_ranks(*grads))
            continue
        flags.append([])
        average_gradients(model)
        opt.step()
    return {"skipped": flags, "weights_finite": is_finite(*model.parameters())}


def nan_run(bad_rank: int = 1, bad_step: int = 1, steps: int = 3, guard: bool = True,
            nprocs: int = 2) -> list:
    """Rank ``bad_rank`` gets a NaN in its batch at ``bad_step``. Per rank: the non-finite ranks
    each step named (``[]`` = step taken) and whether its weights are still finite."""
    return run(_nan_rank, nprocs, bad_rank, bad_step, steps, guard)


def _straggler_rank(slow_rank: int, delay: float, steps: int) -> list:
    rank, model, opt = _rank_model_sgd()
    rows = []
    for step in range(steps + 1):  # step 0 is not kept: the first backward pays one-off setup
        start = time.perf_counter()  # (10-70 ms against 1 ms after, on a busy 2-core machine)
        x, y = _batch(step, rank)
        nn.functional.mse_loss(model(x), y).backward()
        if rank == slow_rank:
            time.sleep(delay)  # the injected slowness: a throttled core, a busy neighbour
        compute = time.perf_counter() - start
        average_gradients(model)  # the fast ranks wait here for the slow one
        opt.step()
        opt.zero_grad()
        times = (step_times(compute), step_times(time.perf_counter() - start))  # every rank
        if step:
            rows.append(times)
    return rows


def straggler_run(slow_rank: int = 1, delay: float = 0.05, steps: int = 4,
                  nprocs: int = 2) -> list:
    """Per step: ``(compute times, step times)`` of every rank, gathered on the ranks."""
    return run(_straggler_rank, nprocs, slow_rank, delay, steps)[0]
