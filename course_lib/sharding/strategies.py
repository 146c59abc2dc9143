"""Wrap a model for data parallelism, ZeRO-1, ZeRO-2 or FSDP (ZeRO-3) — with torch's own classes.

Chapter 03 trains the same model four ways and measures each (chapter 02 uses ``"ddp"``):
``"ddp"`` is DistributedDataParallel with ``gradient_as_bucket_view=True`` (gradients are views
into its buckets); ``"zero1"`` DDP plus ZeroRedundancyOptimizer (whole parameters assigned
greedily: unequal shares, :func:`course_lib.sharding.formulas.zero1_assignment`);
``"fsdp_no_reshard"`` FSDP2 ``fully_shard`` on every block and the root with
``reshard_after_forward=False`` (the old key ``"zero2"`` still works, with a DeprecationWarning);
``"fsdp"`` the same with ``True`` (ZeRO-3). ``precision="amp"``: bf16 compute, fp32 master
weights (autocast for DDP and ZeRO-1, FSDP2's ``MixedPrecisionPolicy``); ``"mixed"`` (the FSDP2
strategies) is that policy read as chapter 01's mixed precision. Byte counts and the traps avoided
(FSDP1's SHARD_GRAD_OP, tied embeddings): docs/modules/sharding.md (strategies.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from course_lib.common.data import get_batch
from course_lib.common.deprecation import renamed
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.common.training import (OPTIMIZER_CLASSES, default_loss, make_optimizer,
                                        validate_optimizer)
from course_lib.sharding.formulas import RENAMED_STRATEGIES, canonical_strategy

__all__ = ["STRATEGIES", "DIST_PRECISIONS", "FSDP_ONLY", "Wrapped", "validate_strategy", "shard_units", "wrap",
           "train_step", "train_rank_sharded", "full_params", "AllReduceHooks"]

STRATEGIES = ("ddp", "zero1", "fsdp_no_reshard", "fsdp")
#: fp32, or "amp" (bf16 compute, fp32 master weights and gradient reduction).
DIST_PRECISIONS = ("fp32", "amp")
#: Strategies built on FSDP2, which also take precision="mixed" (bf16 params gathered, fp32 shards).
FSDP_ONLY = ("fsdp_no_reshard", "fsdp")


@dataclass
class Wrapped:
    """A wrapped model with its optimizer, and how to run a step (autocast dtype, loss)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    strategy: str
    precision: str
    autocast_dtype: torch.dtype | None
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def validate_strategy(strategy: str, precision: str = "fp32", optimizer: str = "adam") -> None:
    """Raise a clear ``ValueError`` for an unknown strategy, precision or optimizer (an old key,
    see :data:`~course_lib.sharding.formulas.RENAMED_STRATEGIES`, passes as its replacement)."""
    strategy = RENAMED_STRATEGIES.get(strategy, strategy) if isinstance(strategy, str) else strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")
    if precision == "mixed" and strategy not in FSDP_ONLY:
        raise ValueError(f"precision='mixed' is offered for {FSDP_ONLY} (FSDP2's MixedPrecisionPolicy); "
                         f"for {strategy!r} use 'amp', or measure_step(precision='mixed') in one process")
    if precision not in DIST_PRECISIONS + ("mixed",):
        raise ValueError(f"precision {precision!r} is not supported for distributed runs; "
                         f"choose one of {DIST_PRECISIONS}")
    validate_optimizer(optimizer)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one: ``model.blocks`` for a GPT, else each child with params.

    Whatever is left (embeddings, final norm, head) belongs to the root group.
    """
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return list(blocks)
    return [child for child in model.children() if any(True for _ in child.parameters())]


def _check_untied(model: nn.Module) -> None:
    seen: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            raise ValueError(f"parameters {seen[id(param)]!r} and {name!r} are tied (one tensor): "
                             "FSDP2 cannot shard them in different groups. Use an untied model "
                             "(GPTConfig(tie_weights=False), the course default) or put the tied "
                             "modules in one fully_shard([...]) group")
        seen[id(param)] = name


class AllReduceHooks(nn.Module):
    """A stand-in for DDP on fake tensors, where DDP's C++ reducer cannot run.

    Like DDP with ``gradient_as_bucket_view=True``, the gradients live in one flat fp32 buffer
    that stays allocated (``zero_grad(set_to_none=True)`` only drops the views): as soon as a
    parameter's gradient is accumulated it is copied into its view of the buffer, which becomes
    ``param.grad``, and all-reduced (summed, then divided by the world size). Same bytes held, same
    bytes sent — one call per parameter instead of per bucket. Only
    :mod:`course_lib.sharding.fake` uses it; a test checks it against DDP.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        params = list(module.parameters())
        flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                           device=params[0].device)
        views, offset = {}, 0
        for p in params:
            views[p] = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        world = dist.get_world_size()

        def reduce(param: torch.Tensor) -> None:
            view = views[param]
            if param.grad is not view:
                view.copy_(param.grad)
                param.grad = view
            dist.all_reduce(view)
            view.div_(world)

        for param in params:
            param.register_post_accumulate_grad_hook(reduce)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def wrap(model: nn.Module, strategy: str = "ddp", *, optimizer: str = "adam",
         precision: str = "fp32", lr: float = 1e-3, mesh=None, foreach: bool | None = None,
         gradient_as_bucket_view: bool = True, ddp_hooks: bool = False) -> Wrapped:
    """Wrap ``model`` (already on this rank's device, same initial weights on every rank).

    Call inside a rank (``course_lib.run``) after ``init_process_group``. ``mesh`` (FSDP only)
    defaults to ``init_device_mesh(<device type>, (world_size,))``; pass one made outside
    ``FakeTensorMode`` for fake runs (with ``foreach=False``). ``lr`` and ``foreach`` go to the
    optimizer. ``ddp_hooks=True`` replaces DDP by :class:`AllReduceHooks` (fake tensors only).
    Returns a :class:`Wrapped`; run steps with :func:`train_step`.
    """
    strategy = canonical_strategy(strategy)
    validate_strategy(strategy, precision, optimizer)
    loss_fn = GPT.loss if isinstance(model, GPT) else default_loss
    autocast = torch.bfloat16 if precision == "amp" and strategy in ("ddp", "zero1") else None
    if strategy in ("ddp", "zero1"):
        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        ddp = AllReduceHooks(model) if ddp_hooks else DistributedDataParallel(
            model, device_ids=ids, gradient_as_bucket_view=gradient_as_bucket_view)
        if strategy == "ddp":
            opt = make_optimizer(ddp.parameters(), optimizer, lr=lr, foreach=foreach)
        else:
            cls, extra = OPTIMIZER_CLASSES[optimizer]
            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls, lr=lr,
                                          foreach=foreach, **extra)
        return Wrapped(ddp, opt, strategy, precision, autocast, loss_fn)
    _check_untied(model)
    if mesh is None:
        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision in ("amp", "mixed") else MixedPrecisionPolicy())
    reshard = strategy == "fsdp"
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    opt = make_optimizer(model.parameters(), optimizer, lr=lr, foreach=foreach)
    return Wrapped(model, opt, strategy, precision, None, loss_fn)


def train_step(wrapped: Wrapped, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One step: ``zero_grad(set_to_none=True)``, forward (+ autocast), backward, ``step``.

    Returns this rank's loss (a detached scalar tensor: ``float()`` it, except on fake
    tensors). Gradients are averaged over ranks by the strategy itself.
    """
    inputs, targets = batch
    wrapped.optimizer.zero_grad(set_to_none=True)
    with torch.autocast(inputs.device.type, dtype=wrapped.autocast_dtype or torch.bfloat16,
                        enabled=wrapped.autocast_dtype is not None):
        loss = wrapped.loss_fn(wrapped.model(inputs), targets)
    loss.backward()
    wrapped.optimizer.step()
    return loss.detach()


def train_rank_sharded(config: GPTConfig | str, strategy: str, *, steps: int = 3,
                       batch: tuple[int, int] = (4, 32), optimizer: str = "adam",
                       precision: str = "fp32", lr: float = 1e-3, seed: int = 0) -> dict:
    """Train ``GPT(config)`` for ``steps`` steps under ``strategy``, inside a rank.

    Every rank builds the model with ``seed`` and trains on its shard of the course data
    (:func:`course_lib.common.data.get_batch`, token ids taken modulo the vocabulary). Returns
    ``{"losses": [...], "params": {name: full tensor}}`` — the same on every rank if the
    strategy is right; tests compare it with DDP and with one process on the global batch.
    """
    config = get_config(config)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    wrapped = wrap(GPT(config), strategy, optimizer=optimizer, precision=precision, lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = get_batch(*batch, seed=seed, step=step, rank=rank, world_size=world)
        losses.append(float(train_step(wrapped, (inputs % config.vocab_size,
                                                 targets % config.vocab_size))))
    return {"losses": losses, "params": full_params(wrapped)}


__getattr__ = renamed(__name__, {"train_rank": "train_rank_sharded"})  # before issue 32


def full_params(wrapped: Wrapped) -> dict[str, torch.Tensor]:
    """Every parameter as a full, unsharded CPU tensor (gathered from the shards for FSDP).

    A collective for FSDP: call it on every rank. Names are those of the unwrapped model.
    """
    model = wrapped.model.module if wrapped.strategy in ("ddp", "zero1") else wrapped.model
    out = {}
    for name, param in model.named_parameters():
        tensor = param.full_tensor() if hasattr(param, "full_tensor") else param
        out[name] = tensor.detach().cpu().clone()
    return out
