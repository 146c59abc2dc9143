"""Run chapter 3's algorithms by hand on ranks: train them, gather their weights, track memory.

Harnesses only (the algorithms are in :mod:`~course_lib.sharding.zero_by_hand` and
:mod:`~course_lib.sharding.fsdp_by_hand`). Every function runs inside a rank and trains
:class:`~course_lib.common.models.GPT` as :func:`course_lib.sharding.strategies.train_rank_sharded`
trains torch's strategies — same seed, data and optimizer — so the results compare directly.
Memory comes from chapter 1's ``GlobalMemTracker``: the shard's gradient is created inside
``step()``, outside forward and backward, so it is told it is a gradient (``track_grads``); the
full buffers of FSDP by hand are registered with it (``track_external``), so their
``resize_`` calls count.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.common.training import make_optimizer
from course_lib.memory.report import categorize
from course_lib.memory.tracker import GlobalMemTracker
from course_lib.sharding.comm_counter import CommCounter
from course_lib.sharding.fsdp_by_hand import FSDPByHand, fsdp_full_state_dict
from course_lib.sharding.rank_measure import make_inputs
from course_lib.sharding.strategies import full_params, train_step, wrap
from course_lib.sharding.zero_by_hand import ShardedOptimizer

__all__ = ["train_zero_rank", "measure_zero_rank", "train_fsdp_rank", "fsdp_full_params",
           "train_torch_fsdp_rank", "peak_rank"]


def _stage(stage):
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")


def train_zero_rank(optimizer_class=ShardedOptimizer, stage: int = 2, config="tiny", *,
                    steps: int = 3, batch: tuple[int, int] = (4, 32), lr: float = 1e-3,
                    seed: int = 0) -> dict:
    """Train with ``optimizer_class(model.parameters(), torch.optim.Adam, stage=..., lr=...)``.
    Returns ``{"losses", "params"}``."""
    _stage(stage)
    rank, world = dist.get_rank(), dist.get_world_size()
    config = get_config(config)
    torch.manual_seed(seed)                           # the same initial weights on every rank
    model = GPT(config)
    optimizer = optimizer_class(model.parameters(), torch.optim.Adam, stage=stage, lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = get_batch(*batch, seed=seed, step=step, rank=rank, world_size=world)
        optimizer.zero_grad()
        loss = GPT.loss(model(inputs % config.vocab_size), targets % config.vocab_size)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def measure_zero_rank(optimizer_class=ShardedOptimizer, stage: int = 2, config="tiny", *,
                      batch: tuple[int, int] = (4, 32), seed: int = 0) -> dict[str, int]:
    """Bytes this rank holds after a step of the sharded optimizer (Adam), as the tracker files
    them, and its peak; two steps (Adam's moments appear in the first)."""
    _stage(stage)
    config = get_config(config)
    torch.manual_seed(seed)
    model = GPT(config)
    optimizer = optimizer_class(model.parameters(), torch.optim.Adam, stage=stage)
    after, peak = _two_steps(model, optimizer, config, batch, seed, sharded=True)
    out = {key: after[key] for key in ("params", "grads", "optimizer")}
    return {**out, "model_states": sum(out.values()), "peak": peak}


def _two_steps(model, opt, config, batch, seed: int, extra=(), sharded: bool = False
               ) -> tuple[dict[str, int], int]:
    """Two training steps under ``GlobalMemTracker``: the categories after the second step and
    the peak. ``sharded``: ``opt`` creates its shard's gradients in ``step()`` (ZeRO-2 by hand),
    so the tracker is told they are gradients."""
    inputs, targets = make_inputs(config, batch, seed=seed, rank=dist.get_rank())
    tracker = GlobalMemTracker()
    tracker.track_external(model, inputs, targets, *extra)
    with tracker:
        for _ in range(2):
            tracker.reset_mod_stats()
            opt.zero_grad(set_to_none=True)
            loss = GPT.loss(model(inputs), targets)
            loss.backward()
            del loss
            opt.step()
            if sharded:
                tracker.track_grads([p.grad for g in opt.inner.param_groups for p in g["params"]
                                     if p.grad is not None])
        after = categorize(tracker.get_tracker_snapshot())
        peak = sum(categorize(tracker.get_tracker_snapshot("peak")).values())
    return after, peak


def fsdp_full_params(fsdp: FSDPByHand) -> dict[str, torch.Tensor]:
    """Every parameter of the wrapped model, all-gathered from the shards (call on every rank);
    :func:`course_lib.sharding.fsdp_by_hand.fsdp_full_state_dict`, under its first name."""
    return fsdp_full_state_dict(fsdp)


def train_fsdp_rank(fsdp_class=FSDPByHand, config="tiny", *, steps: int = 3,
                    batch: tuple[int, int] = (4, 32), optimizer: str = "adamw", lr: float = 1e-3,
                    param_dtype: torch.dtype | None = None, seed: int = 0) -> dict:
    """Train ``fsdp_class(GPT(config), param_dtype=...)`` with ``optimizer`` on its shards.

    Returns ``{"losses", "params", "full_bytes_after_forward", "full_bytes_after_backward",
    "comm"}``: the bytes the units' full buffers hold (read from their storages) at those two
    moments of the last step, and the bytes per collective type of all steps (CommCounter).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    config = get_config(config)
    torch.manual_seed(seed)
    fsdp = fsdp_class(GPT(config), param_dtype=param_dtype)
    opt = make_optimizer(fsdp.parameters(), optimizer, lr=lr)
    losses, held = [], lambda: sum(u.full.untyped_storage().nbytes() for u in fsdp.units)
    out = {}
    with CommCounter() as comm:
        for step in range(steps):
            inputs, targets = get_batch(*batch, seed=seed, step=step, rank=rank, world_size=world)
            opt.zero_grad(set_to_none=True)
            loss = GPT.loss(fsdp(inputs % config.vocab_size), targets % config.vocab_size)
            out["full_bytes_after_forward"] = held()
            loss.backward()
            out["full_bytes_after_backward"] = held()
            opt.step()
            losses.append(loss.item())
    return {**out, "losses": losses, "params": fsdp_full_params(fsdp), "comm": comm.bytes_by_type()}


def train_torch_fsdp_rank(config="tiny", *, steps: int = 3, batch: tuple[int, int] = (4, 32),
                          optimizer: str = "adamw", lr: float = 1e-3, precision: str = "fp32",
                          seed: int = 0) -> dict:
    """The same training with torch's ``fully_shard`` (strategy "fsdp" of
    :mod:`~course_lib.sharding.strategies`): ``{"losses", "params", "comm"}``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    config = get_config(config)
    torch.manual_seed(seed)
    wrapped = wrap(GPT(config), "fsdp", optimizer=optimizer, precision=precision, lr=lr)
    losses = []
    with CommCounter() as comm:
        for step in range(steps):
            inputs, targets = get_batch(*batch, seed=seed, step=step, rank=rank, world_size=world)
            losses.append(float(train_step(wrapped, (inputs % config.vocab_size,
                                                     targets % config.vocab_size))))
    return {"losses": losses, "params": full_params(wrapped), "comm": comm.bytes_by_type()}


def peak_rank(method: str, config="tiny", *, batch: tuple[int, int] = (4, 32),
              seed: int = 0, fsdp_class=FSDPByHand) -> dict[str, int]:
    """Peak bytes of one rank over two Adam steps under ``GlobalMemTracker``, and the model
    states after the step: ``method`` "fsdp" (by hand) or "zero2" (:class:`ShardedOptimizer`)."""
    if method not in ("fsdp", "zero2"):
        raise ValueError(f"method must be 'fsdp' or 'zero2', got {method!r}")
    config = get_config(config)
    torch.manual_seed(seed)
    model = GPT(config)
    if method == "fsdp":
        model = fsdp_class(model)
        opt, extra = torch.optim.Adam(model.parameters(), lr=1e-3), [u.full for u in model.units]
    else:
        opt, extra = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=2, lr=1e-3), []
    after, peak = _two_steps(model, opt, config, batch, seed, extra, sharded=method == "zero2")
    return {"peak": peak, "params": after["params"], "grads": after["grads"],
            "optimizer": after["optimizer"]}
