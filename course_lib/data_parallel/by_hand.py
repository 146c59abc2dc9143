"""Data parallelism by hand, step by step (chapter 2): read it top to bottom.

Data parallelism (DP) keeps a full copy of the model on every rank and splits the **batch**:
1. **same start** — rank 0's weights are broadcast to all (:func:`broadcast_parameters`);
2. **own data** — rank ``r`` trains on its rows of the global batch (``get_batch(rank=r)``);
3. **same gradient** — ``all_reduce(SUM) / N`` turns the ``N`` local gradients into their mean
   (:func:`average_gradients`): the gradient one process computes on all ``N·b`` rows;
4. **same step** — identical weights, gradient and optimizer give identical new weights.

:mod:`course_lib.data_parallel.buckets` does step 3 during backward, in buckets, as torch's DDP;
:mod:`course_lib.data_parallel.measure` trains both against torch and one process.
"""
from __future__ import annotations

import torch.distributed as dist
from torch import nn

__all__ = ["broadcast_parameters", "average_gradients"]


def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Step 1: copy rank ``src``'s parameters and buffers to every rank (in place)."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=src)


def average_gradients(model: nn.Module) -> None:
    """Step 3: replace every rank's gradients with their mean over all ranks (in place)."""
    world = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)   # every rank: g_0 + ... + g_{N-1}
            param.grad /= world                                 # ... / N = the global mean
