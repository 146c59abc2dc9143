"""Chapter 11's runs on real ranks: a teacher-student regression task, DDP with each comm hook.

Every rank trains the same student MLP on its own batches of a fixed random teacher's outputs
(:mod:`.task`: a loss that falls steadily, so "loss after N steps" compares methods). Bytes are what
each rank wrote to its sockets (chapter 2/5's ``bytes_written``: ``wchar`` of /proc/self/io)
during the timed steps, nothing printed meanwhile; predictions come from
:mod:`course_lib.communicating_less.hooks`, never from the measurement.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.common.checks import positive_int
from course_lib.common.models import MLP
from course_lib.communicating_less.local_sgd import local_sgd, outer_step
from course_lib.communicating_less.hooks import HOOKS, START_POWERSGD, validate_hook, \
    predicted_payload, register
from course_lib.data_parallel.ddp_internals import bytes_written
from course_lib.communicating_less.task import LR, SEED, SIZES, eval_loss, task_batch
from course_lib.launcher.launch import run


def _train_step(model, opt, step: int, rank: int, sizes) -> float:
    x, y = task_batch(step, rank, sizes)
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def hooks_rank(hooks: Sequence[str], steps: int, sizes: Sequence[int] = SIZES) -> list[dict]:
    """On every rank, per hook: a fresh DDP student, ``START_POWERSGD`` warm-up steps, then
    ``steps`` timed steps; bytes this rank wrote to its sockets per step, seconds, loss."""
    from torch.nn.parallel import DistributedDataParallel
    rank, out = dist.get_rank(), []
    for name in hooks:
        torch.manual_seed(SEED)
        model = DistributedDataParallel(MLP(sizes))
        register(model, name)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(START_POWERSGD):
            _train_step(model, opt, step, rank, sizes)
        dist.barrier()
        before, start = bytes_written(), time.perf_counter()
        for step in range(START_POWERSGD, START_POWERSGD + steps):
            _train_step(model, opt, step, rank, sizes)
        elapsed, after = time.perf_counter() - start, bytes_written()
        out.append({"hook": name, "sent_per_step": None if before is None
                    else (after - before) / steps, "step_s": elapsed / steps,
                    "loss": eval_loss(model.module, sizes)})
    return out


def compare_hooks(hooks: Sequence[str] = HOOKS, steps: int = 20, sizes: Sequence[int] = SIZES,
                  world: int = 2) -> list[dict]:
    """Each hook on ``world`` ranks of one launch: measured bytes per step beside the prediction.

    Per hook a dict: ``hook``, ``payload`` (predicted bytes the all-reduces carry),
    ``predicted_sent`` (a ring's ``2(p-1)/p`` of it per rank), ``sent`` (measured, rank 0),
    ``share`` (sent / the plain all-reduce's sent, when that hook ran), ``step_s``, ``loss``
    (held-out, after ``START_POWERSGD + steps`` steps).
    """
    hooks = [validate_hook(h) for h in hooks]
    steps, world = positive_int(steps, "steps"), positive_int(world, "world")
    shapes = [p.shape for p in MLP(sizes).parameters()]
    rows = run(hooks_rank, world, hooks, steps, tuple(sizes), threads=1)[0]
    base = next((r["sent_per_step"] for r in rows if r["hook"] == "allreduce"), None)
    for row in rows:
        row["payload"] = predicted_payload(shapes, row["hook"])
        row["predicted_sent"] = 2 * (world - 1) / world * row["payload"]
        row["sent"] = row.pop("sent_per_step")
        row["share"] = row["sent"] / base if base and row["sent"] is not None else None
    return rows


def local_sgd_rank(Hs: Sequence[int], steps: int, inner: str = "adamw", inner_lr: float = 3e-3,
                   outer_lr: float = 0.7, momentum: float = 0.9, sizes: Sequence[int] = SIZES,
                   outer=outer_step) -> list[dict]:
    """On every rank, per H: a fresh student trained by :func:`.local_sgd.local_sgd`; bytes this
    rank wrote to its sockets per inner step, wall seconds, held-out loss, outer steps."""
    rank, out = dist.get_rank(), []
    for H in Hs:
        torch.manual_seed(SEED)
        model = MLP(sizes)
        global_params = [p.detach().clone() for p in model.parameters()]
        outer_opt = torch.optim.SGD(global_params, lr=outer_lr, momentum=momentum,
                                    nesterov=momentum > 0)
        inner_opt = (torch.optim.AdamW(model.parameters(), lr=inner_lr) if inner == "adamw"
                     else torch.optim.SGD(model.parameters(), lr=inner_lr))
        batches = [task_batch(step, rank, sizes) for step in range(steps)]
        dist.barrier()
        before, start = bytes_written(), time.perf_counter()
        losses = local_sgd(model, inner_opt, outer_opt, global_params, batches, H, F.mse_loss,
                           outer=outer)
        elapsed, after = time.perf_counter() - start, bytes_written()
        out.append({"H": H, "sent": None if before is None else (after - before) / steps,
                    "wall_s": elapsed, "loss": eval_loss(model, sizes), "train_loss": losses[-1],
                    "outer_steps": -(-steps // H),
                    "params": [p.detach().clone() for p in model.parameters()]})
    return out


def compare_local_sgd(Hs: Sequence[int] = (1, 4, 16), steps: int = 48, world: int = 2,
                      **options) -> list[dict]:
    """Local SGD / DiLoCo for each H on ``world`` ranks of one launch (rank 0's row per H).

    ``options`` go to :func:`local_sgd_rank` (``inner``, ``inner_lr``, ``outer_lr``,
    ``momentum``). Per H: ``sent`` (bytes per inner step, measured), ``predicted_sent`` (one
    ring all-reduce of the fp32 model per H steps), ``wall_s``, ``loss``, ``outer_steps``.
    """
    Hs = [positive_int(h, "H") for h in Hs]
    steps, world = positive_int(steps, "steps"), positive_int(world, "world")
    n_params = sum(p.numel() for p in MLP(options.get("sizes", SIZES)).parameters())
    rows = run(local_sgd_rank, world, Hs, steps, threads=1, **options)[0]
    for row in rows:
        row.pop("params")
        row["predicted_sent"] = 2 * (world - 1) / world * 4 * n_params * row["outer_steps"] / steps
    return rows


def hooks_and_local_sgd(hook_steps: int = 6, local_steps: int = 16,
                        Hs: Sequence[int] = (1, 16)) -> dict:
    """Both measurements in one call: the notebook's slow link starts its namespace once."""
    return {"hooks": compare_hooks(HOOKS, steps=hook_steps),
            "local_sgd": compare_local_sgd(Hs, steps=local_steps)}
