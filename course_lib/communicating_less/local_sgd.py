"""Local SGD / DiLoCo by hand (chapter 11; the notebook's editable cell is a copy of this file).

Each rank takes H inner steps alone (AdamW in DiLoCo: Douillard et al., "DiLoCo: Distributed
Low-Communication Training of Language Models", 2023), then one outer step: the pseudo-gradient
``global - local`` (how far the rank moved, pointing back) is averaged over ranks with one
all-reduce, and an outer optimizer (SGD with Nesterov momentum in DiLoCo) steps the global
copy, which every rank then loads. One all-reduce of the model per H steps instead of one per
step. With an SGD inner step, H = 1 and an outer SGD of lr 1 without momentum this is DDP:
``θ - 1·mean(η g_r)`` (tests/communicating_less/test_local_sgd.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def outer_step(model, global_params, outer_opt):
    """Average the pseudo-gradients ``global - local`` over ranks, step the global copy with
    ``outer_opt`` (built on ``global_params``), and load the result into ``model``."""
    local = [p.detach() for p in model.parameters()]
    delta = torch.cat([(g - p).reshape(-1) for g, p in zip(global_params, local)])
    dist.all_reduce(delta)  # one message for the whole model
    delta /= dist.get_world_size()
    for g, d in zip(global_params, delta.split([g.numel() for g in global_params])):
        g.grad = d.view_as(g)
    outer_opt.step()
    with torch.no_grad():
        for p, g in zip(model.parameters(), global_params):
            p.copy_(g)


def local_sgd(model, inner_opt, outer_opt, global_params, batches, H, loss_fn,
              outer=outer_step):
    """Train on ``batches`` (an iterable of (x, y)): an inner step each, an outer step every
    ``H`` steps (and after the last one); return the inner losses."""
    losses = []
    for step, (x, y) in enumerate(batches, 1):
        inner_opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        inner_opt.step()
        losses.append(loss.item())
        if step % H == 0:
            outer(model, global_params, outer_opt)
    if len(losses) % H:
        outer(model, global_params, outer_opt)
    return losses
