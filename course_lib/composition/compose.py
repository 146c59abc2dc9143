"""FSDP2 × TP and HSDP on one DeviceMesh: the model a rank builds for a 2-D layout.

The PyTorch "FSDP + TP" recipe: tensor-parallelise every block along the mesh's ``"tp"``
dimension with ``parallelize_module`` (Megatron's column/row split, chapter 4's
:func:`~course_lib.tensor_parallel.layers.dtensor_block`), then ``fully_shard`` every block and
the root along the data-parallel sub-mesh. HSDP is ``fully_shard`` given a 2-D mesh
``("dp_replicate", "dp_shard")``: parameters sharded along the second dimension, replicated
(gradients all-reduced) along the first. Each data-parallel coordinate reads its own batch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig
from course_lib.common.training import make_optimizer
from course_lib.composition.layout import MESH_ORDER, Layout
from course_lib.composition.stored import local_bytes, state_bytes
from course_lib.tensor_parallel.layers import dtensor_block, qkv_rows

__all__ = ["MESH_ORDER", "build_2d", "data_parallel", "train_2d", "local_bytes", "state_bytes",
           "dense_params"]


def build_2d(config: GPTConfig, layout: Layout, seed: int = 0, device: str = "cpu"):
    """Inside a rank: the mesh, the wrapped GPT, this rank's data-parallel (index, size).

    ``"dp"`` wraps the model in torch DDP; ``"dp_shard"`` (with ``"dp_replicate"``: HSDP) in
    FSDP2; ``"tp"`` alone leaves the tensor-parallel blocks unwrapped. ``device="cuda"``: the
    mesh and the model on this rank's current GPU (chapter 12's script under NCCL)."""
    mesh = layout.mesh(device)
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    if layout.tp > 1:
        model.blocks = torch.nn.ModuleList(dtensor_block(b, config, mesh["tp"]) for b in model.blocks)
    model = data_parallel(model, model.blocks, layout, mesh)
    return mesh, model, layout.dp_index(mesh), layout.dp_size


def data_parallel(model: torch.nn.Module, blocks, layout: Layout, mesh) -> torch.nn.Module:
    """``model`` wrapped for the layout's data parallelism: torch DDP over ``"dp"``, else FSDP2
    over the data-parallel sub-mesh, each of ``blocks`` a unit of its own (unchanged without)."""
    dp_names = layout.dp_names
    if layout.dp > 1 and layout.tp > 1:  # DDP takes no DTensors: FSDP2's replicate does
        return replicate(model, mesh=mesh["dp"])
    if layout.dp > 1:  # plain data parallelism: the model whole on every rank
        return DistributedDataParallel(model, process_group=mesh.get_group("dp"))
    if dp_names:
        dp_mesh = mesh[dp_names] if len(dp_names) > 1 else mesh[dp_names[0]]
        for block in blocks:
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model


def dense_params(model: torch.nn.Module, config: GPTConfig, tp: int,
                 grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (``grads``: its gradient) gathered in full — a collective — with the qkv
    rows put back in the dense order."""
    order = torch.cat([qkv_rows(config, r, tp) for r in range(tp)]) if tp > 1 else None
    out = {}
    for name, p in model.named_parameters():
        p = p.grad if grads else p
        full = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        if order is not None and name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            dense = torch.empty_like(full)
            dense[order] = full
            full = dense
        out[name] = full
    return out


def train_2d(config: GPTConfig, layout: Layout, steps: int, batch: tuple[int, int],
             lr: float = 1e-3, seed: int = 0) -> dict:
    """Inside a rank: train ``steps`` Adam steps; return losses, model-state bytes, full weights."""
    mesh, model, dp_index, dp_size = build_2d(config, layout, seed)
    optimizer = make_optimizer(model.parameters(), "adam", lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = get_batch(*batch, seed=seed, step=step, rank=dp_index, world_size=dp_size)
        optimizer.zero_grad(set_to_none=True)
        loss = GPT.loss(model(inputs % config.vocab_size), targets % config.vocab_size)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    measured = state_bytes(model, optimizer)
    model = getattr(model, "module", model)  # DDP's parameters are named "module.<name>"
    return {"rank": dist.get_rank(), "losses": losses, "bytes": measured,
            "params": dense_params(model, config, layout.tp),
            "grads": dense_params(model, config, layout.tp, grads=True)}
