"""Pipeline × FSDP (× TP) on a 2-D or 3-D mesh ("pp", "dp_shard"[, "tp"]), the pipeline by hand.

Stage 0 holds the embeddings and the first ``n_layer / pp`` blocks, the last stage the last
blocks, ``ln_f`` and ``lm_head`` (``pp = 2`` here: one micro-batch, no schedule to hide the
bubble — chapter 4 measures schedules). Each stage's modules are ``fully_shard``-ed over the
``dp_shard`` sub-mesh, after chapter 4's Megatron split along ``tp`` when the layout has one
(the PP × TP × DP layout of Megatron-LM and torchtitan, on 8 ranks). Forward: stage 0 sends its activations to stage 1 along the ``pp``
dimension (each tensor-parallel rank sends its own, identical copy to its peer with the same
``dp_shard`` and ``tp`` coordinates); backward: stage 1 sends the activations' gradient back and
stage 0 continues its backward from it (``h.backward(grad)``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig
from course_lib.common.training import make_optimizer
from course_lib.composition.compose import MESH_ORDER, dense_params, state_bytes
from course_lib.tensor_parallel.layers import dtensor_block

__all__ = ["train_pp"]


class _Stage(nn.Module):
    """The part of a GPT one stage holds; its forward goes through FSDP's hooks."""

    def __init__(self, gpt: GPT, stage: int) -> None:
        super().__init__()
        self.gpt, self.stage = gpt, stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.gpt
        if self.stage == 0:
            x = m.tok_emb(x) + m.pos_emb(torch.arange(x.size(1)))
        for block in m.blocks:
            x = block(x)
        return m.lm_head(m.ln_f(x)) if self.stage == 1 else x


def train_pp(config: GPTConfig, layout: dict[str, int], steps: int, batch: tuple[int, int],
             lr: float = 1e-3, seed: int = 0) -> dict:
    """Inside a rank: train the GPT split in 2 stages, each sharded over ``dp_shard`` (and split
    over ``tp``)."""
    pp, dp, tp = layout["pp"], layout.get("dp_shard", 1), layout.get("tp", 1)
    names = tuple(n for n in MESH_ORDER if n in layout)
    mesh = init_device_mesh("cpu", tuple(layout[n] for n in names), mesh_dim_names=names)
    stage, dp_index = mesh.get_local_rank("pp"), mesh.get_local_rank("dp_shard")
    peer = dist.get_process_group_ranks(mesh.get_group("pp"))[1 - stage]
    torch.manual_seed(seed)
    model = GPT(config)
    k = config.n_layer // pp
    model.blocks = nn.ModuleList(list(model.blocks)[:k] if stage == 0 else list(model.blocks)[k:])
    if stage == 0:
        model.ln_f, model.lm_head = nn.Identity(), nn.Identity()
    else:
        model.tok_emb, model.pos_emb = nn.Identity(), nn.Identity()
    if tp > 1:
        model.blocks = nn.ModuleList(dtensor_block(b, config, mesh["tp"]) for b in model.blocks)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp_shard"])
    model = fully_shard(_Stage(model, stage), mesh=mesh["dp_shard"])
    optimizer = make_optimizer(model.parameters(), "adam", lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = get_batch(*batch, seed=seed, step=step, rank=dp_index, world_size=dp)
        optimizer.zero_grad(set_to_none=True)
        shape = (batch[0], batch[1], config.d_model)
        if stage == 0:
            h = model(inputs % config.vocab_size)
            dist.send(h.detach().contiguous(), peer)
            grad = torch.empty(shape)
            dist.recv(grad, peer)
            h.backward(grad)
            loss = torch.empty(())
            dist.recv(loss, peer)
        else:
            h = torch.empty(shape)
            dist.recv(h, peer)
            h.requires_grad_(True)
            loss = GPT.loss(model(h), targets % config.vocab_size)
            loss.backward()
            dist.send(h.grad.contiguous(), peer)
            dist.send(loss.detach(), peer)
        optimizer.step()
        losses.append(loss.item())
    measured = state_bytes(model, optimizer)

    def dense_names(tensors: dict) -> dict:  # "gpt.blocks.0.x" on stage 1 -> "blocks.<k>.x"
        out = {}
        for name, t in tensors.items():
            name = name.removeprefix("gpt.")
            if name.startswith("blocks.") and stage == 1:
                name = f"blocks.{int(name.split('.')[1]) + k}." + name.split(".", 2)[2]
            out[name] = t
        return out
    return {"rank": dist.get_rank(), "losses": losses, "bytes": measured, "stage": stage,
            "params": dense_names(dense_params(model, config, tp)),
            "grads": dense_names(dense_params(model, config, tp, grads=True))}
