"""FSDP2 with a ``MixedPrecisionPolicy`` inside a rank: what each rank keeps, and what one step sends.

Chapter 03's cell "the same calls inside the ranks" is the editable copy of :func:`fsdp2_demo`. Its
section on ``MixedPrecisionPolicy`` runs it on real ranks for three choices (fp32; bf16 parameters
with fp32 reduction; both bf16) beside the prediction from the parameter count and the two dtypes:
with every block and the root resharded after forward, each parameter is all-gathered twice per
step in ``param_dtype`` and its gradient reduce-scattered once in ``reduce_dtype`` (``None``: in
``param_dtype``). The message sizes are counted by
:class:`~course_lib.sharding.comm_counter.CommCounter` (the full buffer of each collective, as
nccl-tests reports it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.sharding.comm_counter import CommCounter

__all__ = ["fsdp2_demo"]


def fsdp2_demo(reshard_after_forward=True, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, steps=2):
    """Train the tiny GPT with FSDP2 on this rank: its weight's shapes and dtypes, and the last step's bytes sent."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)                                   # the same initial weights on every rank
    model = GPT(get_config("tiny"))
    mesh = init_device_mesh("cpu", (world,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    seen = []                                              # the weight a layer computes with
    model.blocks[0].attn.qkv.register_forward_pre_hook(
        lambda layer, args: seen.append((tuple(layer.weight.shape), layer.weight.dtype)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, counter = [], CommCounter()                    # counter: every collective's bytes and dtype
    for step in range(steps):
        inputs, targets = get_batch(4, 32, seed=0, step=step, rank=rank, world_size=world)
        counter.reset()                                    # keep the last step's
        optimizer.zero_grad()
        with counter:
            loss = GPT.loss(model(inputs), targets)
            loss.backward()
        optimizer.step()
        losses.append(loss.item())
    w = model.blocks[0].attn.qkv.weight                    # a DTensor: this rank's rows only
    dtypes = {kind: dtype for kind, _, dtype in counter.calls}
    sent = {kind: (total, dtypes[kind]) for kind, total in counter.bytes_by_type().items()}
    return {"full": tuple(w.shape), "local": tuple(w.to_local().shape), "stored": w.dtype,
            "computed": seen[-1], "grad": w.grad.to_local().dtype, "falls": losses[-1] < losses[0],
            "adam": tuple(optimizer.state[w]["exp_avg"].to_local().shape), "sent": sent}

