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

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig
from course_lib.common.training import make_optimizer
from course_lib.composition.compose import data_parallel, dense_params, state_bytes
from course_lib.composition.layout import Layout
from course_lib.tensor_parallel.layers import dtensor_block

__all__ = ["train_pp", "build_pp", "pp_step", "pp_dense_names"]


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


def build_pp(config: GPTConfig, layout: Layout, seed: int = 0) -> dict:
    """Inside a rank: this rank's stage of the GPT (split over ``tp``, sharded over ``dp_shard``
    or wrapped in DDP over ``dp`` when the layout has them). Returns ``model``, ``stage``,
    ``peer`` (the other stage's rank), ``dp_index``, ``dp_size`` and ``first`` (the global index
    of the stage's first block)."""
    mesh = layout.mesh("cpu")
    stage = mesh.get_local_rank("pp")
    peer = dist.get_process_group_ranks(mesh.get_group("pp"))[1 - stage]
    torch.manual_seed(seed)
    model = GPT(config)
    k = config.n_layer // layout.pp
    model.blocks = nn.ModuleList(list(model.blocks)[:k] if stage == 0 else list(model.blocks)[k:])
    if stage == 0:
        model.ln_f, model.lm_head = nn.Identity(), nn.Identity()
    else:
        model.tok_emb, model.pos_emb = nn.Identity(), nn.Identity()
    if layout.tp > 1:
        model.blocks = nn.ModuleList(dtensor_block(b, config, mesh["tp"]) for b in model.blocks)
    model = data_parallel(_Stage(model, stage), model.blocks, layout, mesh)
    return {"model": model, "stage": stage, "peer": peer, "dp_index": layout.dp_index(mesh),
            "dp_size": layout.dp_size, "first": stage * k}


def pp_step(built: dict, config: GPTConfig, inputs: torch.Tensor, targets: torch.Tensor,
            backward: bool = True) -> torch.Tensor:
    """Forward (and backward) of one batch through both stages; every rank returns the loss."""
    model, stage, peer = built["model"], built["stage"], built["peer"]
    shape = (inputs.size(0), inputs.size(1), config.d_model)
    if stage == 0:
        h = model(inputs)
        dist.send(h.detach().contiguous(), peer)
        if backward:
            grad = torch.empty(shape)
            dist.recv(grad, peer)
            h.backward(grad)
        loss = torch.empty(())
        dist.recv(loss, peer)
        return loss
    h = torch.empty(shape)
    dist.recv(h, peer)
    h.requires_grad_(backward)
    loss = GPT.loss(model(h), targets)
    if backward:
        loss.backward()
        dist.send(h.grad.contiguous(), peer)
    dist.send(loss.detach(), peer)
    return loss


def pp_dense_names(tensors: dict, built: dict) -> dict:
    """``gpt.blocks.0.x`` on a later stage -> ``blocks.<first>.x``: the dense model's names."""
    out = {}
    for name, t in tensors.items():
        name = name.removeprefix("gpt.")
        if name.startswith("blocks."):
            name = f"blocks.{int(name.split('.')[1]) + built['first']}." + name.split(".", 2)[2]
        out[name] = t
    return out


def train_pp(config: GPTConfig, layout: Layout, steps: int, batch: tuple[int, int],
             lr: float = 1e-3, seed: int = 0) -> dict:
    """Inside a rank: train the GPT split in 2 stages, each sharded over ``dp_shard`` or
    replicated over ``dp`` (and split over ``tp``)."""
    built = build_pp(config, layout, seed)
    model, tp = built["model"], layout.tp
    optimizer = make_optimizer(model.parameters(), "adam", lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = get_batch(*batch, seed=seed, step=step, rank=built["dp_index"],
                                    world_size=built["dp_size"])
        optimizer.zero_grad(set_to_none=True)
        loss = pp_step(built, config, inputs % config.vocab_size, targets % config.vocab_size)
        optimizer.step()
        losses.append(loss.item())
    measured = state_bytes(model, optimizer)
    model = getattr(model, "module", model)  # DDP's parameters are named "module.<name>"
    return {"rank": dist.get_rank(), "losses": losses, "bytes": measured, "stage": built["stage"],
            "params": pp_dense_names(dense_params(model, config, tp), built),
            "grads": pp_dense_names(dense_params(model, config, tp, grads=True), built)}
