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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig
from course_lib.common.training import make_optimizer
from course_lib.tensor_parallel.layers import dtensor_block, qkv_rows

__all__ = ["MESH_ORDER", "build_2d", "train_2d", "local_bytes", "state_bytes", "dense_params"]

#: the order of named dimensions in a mesh, outermost first (torchtitan's order)
MESH_ORDER = ("pp", "dp", "dp_replicate", "dp_shard", "cp", "tp", "ep")


def build_2d(config: GPTConfig, layout: dict[str, int], seed: int = 0, device: str = "cpu"):
    """Inside a rank: the mesh, the wrapped GPT, this rank's data-parallel (index, size).

    ``"dp"`` wraps the model in torch DDP; ``"dp_shard"`` (with ``"dp_replicate"``: HSDP) in
    FSDP2; ``"tp"`` alone leaves the tensor-parallel blocks unwrapped. ``device="cuda"``: the
    mesh and the model on this rank's current GPU (chapter 12's script under NCCL)."""
    names = tuple(n for n in MESH_ORDER if n in layout)
    mesh = init_device_mesh(device, tuple(layout[n] for n in names), mesh_dim_names=names)
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    if "tp" in layout:
        model.blocks = torch.nn.ModuleList(dtensor_block(b, config, mesh["tp"]) for b in model.blocks)
    dp_names = tuple(n for n in ("dp", "dp_replicate", "dp_shard") if n in layout)
    if "dp" in layout:  # plain data parallelism: torch DDP, the model whole on every rank
        model = DistributedDataParallel(model, process_group=mesh.get_group("dp"))
    elif dp_names:
        dp_mesh = mesh[dp_names] if len(dp_names) > 1 else mesh[dp_names[0]]
        for block in model.blocks:
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    dp_index, dp_size = 0, 1
    for n in dp_names:  # row-major coordinate among the data-parallel ranks
        dp_index, dp_size = dp_index * layout[n] + mesh.get_local_rank(n), dp_size * layout[n]
    return mesh, model, dp_index, dp_size


def local_bytes(tensors) -> int:
    """Bytes of the distinct storages behind the local parts of ``tensors`` (DTensor → local)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """This rank's model-state bytes as stored: params, grads, optimizer state and their sum."""
    params = list(model.parameters())
    measured = {"params": local_bytes(params), "grads": local_bytes(p.grad for p in params),
                "optimizer": local_bytes(v for s in optimizer.state.values() for v in s.values())}
    measured["model_states"] = sum(measured.values())
    return measured


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


def train_2d(config: GPTConfig, layout: dict[str, int], steps: int, batch: tuple[int, int],
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
            "params": dense_params(model, config, layout.get("tp", 1)),
            "grads": dense_params(model, config, layout.get("tp", 1), grads=True)}
