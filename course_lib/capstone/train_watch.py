"""Run a learner's ``train.py`` in this rank and write down what it did, without changing it.

``python train_watch.py SCRIPT ARGS...`` (under torchrun: each rank) runs SCRIPT as ``__main__``
with ARGS (its folder first on ``sys.path``, for its ``import tiny``) and appends one JSON line
per event to ``$COURSE_TRAIN_WATCH/rank{RANK}.jsonl``, flushed at once (the script ends with
``os._exit``): ``shard`` (the class of each module ``fully_shard`` wraps), ``epoch`` (the epoch a
``DistributedSampler`` starts iterating with), and per optimizer step ``step``: the FSDP
reduce-scatters since the previous step, whether every parameter is a DTensor, and the norm of
the whole gradient as the optimizer receives it (all ranks' shards: a collective, which every
rank makes at the same point). Chapter 12's check (``exercises_train.py``) reads the lines.
"""
from __future__ import annotations

import json
import os
import runpy
import sys

import torch
import torch.distributed as dist
import torch.distributed.fsdp as fsdp
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DistributedSampler

WATCH_ENV = "COURSE_TRAIN_WATCH"


def _writer():
    path = os.path.join(os.environ[WATCH_ENV], f"rank{os.environ.get('RANK', '0')}.jsonl")
    out = open(path, "a", encoding="utf-8")

    def write(kind: str, **fields) -> None:
        out.write(json.dumps({"kind": kind, **fields}) + "\n")
        out.flush()
    return write


def global_grad_norm(params: list) -> float:
    """The 2-norm of every gradient over all ranks' shards (DTensor: per mesh, then combined);
    a plain tensor counts as this rank's own."""
    by_mesh: dict = {}
    for p in params:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            by_mesh.setdefault(key, []).append(p.grad)
    squares = []
    for mesh, grads in by_mesh.items():
        norm = torch.nn.utils.get_total_norm(grads)
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2)
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


def watch(write) -> None:
    """Install the observers (they call through to torch's own functions)."""
    counts = {"reduce_scatter": 0}
    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        real = getattr(dist, name)

        def counted(*args, _real=real, **kwargs):
            counts["reduce_scatter"] += 1
            return _real(*args, **kwargs)
        setattr(dist, name, counted)

    real_shard = fsdp.fully_shard

    def fully_shard(module, *args, **kwargs):
        for m in (module if isinstance(module, (list, tuple)) else [module]):
            write("shard", module=type(getattr(m, "_orig_mod", m)).__name__)
        return real_shard(module, *args, **kwargs)
    fsdp.fully_shard = fully_shard

    real_iter = DistributedSampler.__iter__

    def sampler_iter(self):
        write("epoch", epoch=self.epoch)
        return real_iter(self)
    DistributedSampler.__iter__ = sampler_iter

    def before_step(optimizer, args, kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        write("step", reduce_scatters=counts["reduce_scatter"],
              all_dtensor=all(isinstance(p, DTensor) for p in params),
              norm=global_grad_norm(params) if dist.is_initialized() else None)
        counts["reduce_scatter"] = 0
    register_optimizer_step_pre_hook(before_step)


if __name__ == "__main__":
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path.insert(0, os.path.dirname(script))
    watch(_writer())
    runpy.run_path(script, run_name="__main__")
