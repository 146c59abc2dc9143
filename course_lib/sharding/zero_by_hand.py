"""ZeRO-1 and ZeRO-2 by hand: a flat buffer, one shard of Adam per rank (chapter 3).

The notebook types :func:`shard_bounds` and :class:`ZeRO` in a cell; this is their library copy
(a test keeps the two identical). The model's parameters become views into **one flat fp32
buffer**, padded to ``N`` equal shards of ``ceil(Ψ/N)`` elements; rank ``r`` owns shard ``r``
(:func:`shard_bounds`: ``torch.chunk``'s rule, the one FSDP2 applies to each parameter's rows)
and keeps Adam's two moments for it alone. A step:

* **ZeRO-1** (``stage=1``): ``all_reduce`` the flat gradient — every rank receives the whole
  sum, ``4Ψ`` bytes, and keeps it — and take the own shard of it;
* **ZeRO-2** (``stage=2``): ``reduce_scatter_single`` — only the sum of the own shard arrives
  (``4Ψ/N`` bytes kept); the full local gradients are dropped;
* both: divide by ``N``, Adam on the own shard (updating the flat buffer in place), then
  ``all_gather_single`` so every rank holds every updated shard again. (These two are torch
  2.13's names for ``reduce_scatter_tensor`` and ``all_gather_into_tensor``, now deprecated.)

This minimal version reduces after backward; DeepSpeed's ZeRO-2 reduce-scatters bucket by bucket
*during* backward, so the full gradient never exists at once. After the step both hold what the
paper's formula says (:func:`course_lib.sharding.formulas.flat_zero_bytes`); measured here with
the memory tracker of chapter 1 (:func:`measure_zero_rank`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.memory.report import categorize
from course_lib.memory.tracker import GlobalMemTracker
from course_lib.sharding.rank_measure import make_inputs

__all__ = ["shard_bounds", "ZeRO", "train_zero_rank", "measure_zero_rank"]


def shard_bounds(numel, rank, world):
    """The slice ``[start, stop)`` of a flat buffer of ``numel`` elements that ``rank`` owns."""
    size = -(-numel // world)                # ceil: equal shards, the last ones shorter (padding)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ZeRO:
    """ZeRO-1 or ZeRO-2 by hand: Adam on this rank's shard of one flat fp32 buffer."""

    def __init__(self, model, stage=2, lr=1e-3):
        self.params, self.stage = list(model.parameters()), stage
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(-(-self.numel // self.world) * self.world)  # N equal shards
        offset = 0
        for p in self.params:                         # the model now reads the flat buffer
            self.flat[offset:offset + p.numel()] = p.detach().flatten()
            p.data = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        start, stop = shard_bounds(self.numel, self.rank, self.world)
        self.shard = self.flat[start:stop]            # my parameters: a view, updated in place
        self.optimizer = torch.optim.Adam([self.shard], lr=lr)  # moments for my shard only

    def zero_grad(self):
        self.shard.grad = None

    def step(self):
        """Average the gradients, step Adam on my shard, all-gather the parameters."""
        grads = torch.zeros_like(self.flat)
        torch.cat([p.grad.flatten() for p in self.params], out=grads[:self.numel])
        for p in self.params:
            p.grad = None                             # the local gradients are used up
        if self.stage == 1:                           # ZeRO-1: every rank gets the whole sum
            dist.all_reduce(grads)
            mine = grads.view(self.world, -1)[self.rank]
        else:                                         # ZeRO-2: only my shard's sum arrives
            mine = torch.empty(self.flat.numel() // self.world)
            dist.reduce_scatter_single(mine, grads)
        mine /= self.world
        self.shard.grad = mine[:self.shard.numel()]
        self.optimizer.step()                         # Adam on my shard only
        dist.all_gather_single(self.flat, self.flat.view(self.world, -1)[self.rank].clone())


def train_zero_rank(zero_class=ZeRO, stage: int = 2, config="tiny", *, steps: int = 3,
                    batch: tuple[int, int] = (4, 32), lr: float = 1e-3, seed: int = 0) -> dict:
    """Inside a rank: train with ``zero_class(model, stage=..., lr=...)`` as
    :func:`course_lib.sharding.strategies.train_rank` trains torch's strategies (same seed, data
    and Adam), so the results compare directly. Returns ``{"losses", "params"}``."""
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = get_config(config)
    torch.manual_seed(seed)                           # the same initial weights on every rank
    model = GPT(config)
    zero = zero_class(model, stage=stage, lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = get_batch(*batch, seed=seed, step=step, rank=rank, world_size=world)
        zero.zero_grad()
        loss = GPT.loss(model(inputs % config.vocab_size), targets % config.vocab_size)
        loss.backward()
        zero.step()
        losses.append(loss.item())
    return {"losses": losses,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def measure_zero_rank(zero_class=ZeRO, stage: int = 2, config="tiny", *,
                      batch: tuple[int, int] = (4, 32), seed: int = 0) -> dict[str, int]:
    """Inside a rank: bytes this rank holds after a ZeRO step, as the memory tracker files them.

    Two steps (Adam's moments appear in the first) under chapter 1's ``GlobalMemTracker``. The
    shard's gradient is created inside ``step()``, outside forward and backward, so the tracker
    would file it as an activation: it is told it is a gradient (``track_grads``).
    """
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    config = get_config(config)
    torch.manual_seed(seed)
    model = GPT(config)
    zero = zero_class(model, stage=stage)
    inputs, targets = make_inputs(config, batch, seed=seed, rank=dist.get_rank())
    tracker = GlobalMemTracker()
    tracker.track_external(model, inputs, targets)
    with tracker:
        for _ in range(2):
            tracker.reset_mod_stats()
            zero.zero_grad()
            loss = GPT.loss(model(inputs), targets)
            loss.backward()
            del loss
            zero.step()
            tracker.track_grads([zero.shard.grad])
        after = categorize(tracker.get_tracker_snapshot())
    out = {key: after[key] for key in ("params", "grads", "optimizer")}
    out["model_states"] = sum(out.values())
    return out
