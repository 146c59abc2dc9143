"""ZeRO-1 and ZeRO-2 by hand: any torch optimizer, its state kept for this rank's shard (chapter 3).

The notebook types :func:`shard_bounds` and :class:`ShardedOptimizer` in a cell; this is their
library copy. Each param group's trainable parameters become views into **one flat buffer**,
padded to ``N`` equal shards of ``ceil(Ψ/N)`` elements; rank ``r`` owns :func:`shard_bounds`'s
slice (``torch.chunk``'s rule). The inner optimizer sees only the *pieces* of the own shard, so
per-group hyperparameters, parameters without a gradient (skipped) and a 4-byte ``step`` per
piece work as in the plain optimizer. A step averages the gradients (ZeRO-1 ``all_reduce``s the
whole flat gradient and keeps it, ZeRO-2 ``reduce_scatter_single``s it so only the own shard's
sum arrives), steps the pieces, then ``all_gather_single``s the parameters. Harnesses
(training, the memory tracker) are in :mod:`course_lib.sharding.hand_measure`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["shard_bounds", "ShardedState", "ShardedOptimizer", "ZeRO"]


def shard_bounds(numel, rank, world):
    """The slice ``[start, stop)`` of a flat buffer of ``numel`` elements that ``rank`` owns."""
    size = -(-numel // world)                # ceil: equal shards, the last ones shorter (padding)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedState(torch.optim.Optimizer):
    """What :class:`ShardedOptimizer` needs besides its step: its arguments checked, ``zero_grad``
    of the inner optimizer too, and a state dict of this rank's shard."""

    @staticmethod
    def check(optimizer_cls, stage):
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 (shard the optimizer states) or 2 (and the "
                             f"gradients), got {stage!r}")
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_cls must be a torch.optim.Optimizer class such as "
                            f"torch.optim.AdamW (not an instance), got {optimizer_cls!r}")

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none)
        self.inner.zero_grad(set_to_none)

    def state_dict(self):
        """This rank's shard of the state (each rank saves its own, as DCP does)."""
        return {"rank": self.rank, "world": self.world, "stage": self.stage,
                "inner": self.inner.state_dict()}

    def load_state_dict(self, state_dict):
        mine = {"rank": self.rank, "world": self.world, "stage": self.stage}
        theirs = {key: state_dict.get(key) for key in mine}
        if theirs != mine:
            raise ValueError(f"this state dict was saved by {theirs}, not by {mine}: each rank "
                             "loads the shard it saved, at the same world size and stage")
        self.inner.load_state_dict(state_dict["inner"])
        for group, inner in zip(self.param_groups, self.inner.param_groups):
            group.update({k: v for k, v in inner.items() if k != "params"})


class ShardedOptimizer(ShardedState):
    """ZeRO-1 (``stage=1``) or ZeRO-2 (``stage=2``): ``optimizer_cls`` on this rank's shard only."""

    def __init__(self, params, optimizer_cls, *, stage=1, **optimizer_kwargs):
        self.check(optimizer_cls, stage)
        super().__init__(params, optimizer_kwargs)
        self.stage, self.rank, self.world = stage, dist.get_rank(), dist.get_world_size()
        self.flats, inner_groups = [], []
        for group in self.param_groups:
            trained = [p for p in group["params"] if p.requires_grad]    # frozen ones: skipped
            flat, pieces = self._flatten(trained)
            self.flats.append((flat, trained, pieces))
            inner_groups.append({**group, "params": [piece for piece, _ in pieces]})
        self.inner = optimizer_cls(inner_groups, **optimizer_kwargs)  # states for my pieces only
        for group, inner in zip(self.param_groups, self.inner.param_groups):
            group.update({k: v for k, v in inner.items() if k != "params"})  # its defaults too

    def _flatten(self, params):
        """Copy ``params`` into one padded flat buffer, make them views of it; my pieces of it."""
        numel = sum(p.numel() for p in params)
        if len({(p.dtype, p.device) for p in params}) > 1:
            raise ValueError("a param group mixes dtypes or devices: give each its own group")
        like = params[0] if params else torch.empty(0)
        flat = torch.zeros(-(-numel // self.world) * self.world, dtype=like.dtype, device=like.device)
        start, stop = shard_bounds(numel, self.rank, self.world)
        pieces, offset = [], 0
        for p in params:                              # the model now reads the flat buffer
            flat[offset:offset + p.numel()] = p.detach().flatten()
            p.data = flat[offset:offset + p.numel()].view_as(p)
            lo, hi = (min(max(x, start), stop) for x in (offset, offset + p.numel()))
            pieces.append((flat[lo:hi], (lo - start, hi - start)))  # my part of p, maybe empty
            offset += p.numel()
        return flat, pieces

    def step(self, closure=None):
        """Average the gradients, step my pieces, all-gather the parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, inner, (flat, params, pieces) in zip(self.param_groups, self.inner.param_groups,
                                                        self.flats):
            inner.update({k: v for k, v in group.items() if k != "params"})  # lr schedules
            if params:
                self._reduce(flat, params, pieces)
        self.inner.step()
        for flat, params, _ in self.flats:
            if params:
                dist.all_gather_single(flat, flat.view(self.world, -1)[self.rank].clone())
        return loss

    def _reduce(self, flat, params, pieces):
        """Give each piece of my shard the average gradient (None: no rank computed one)."""
        got = torch.tensor([int(p.grad is not None) for p in params], device=flat.device)
        dist.all_reduce(got, op=dist.ReduceOp.MAX)    # one rank's gradient is enough
        grads, offset = torch.zeros_like(flat), 0
        for p in params:
            if p.grad is not None:
                grads[offset:offset + p.numel()] = p.grad.flatten()
            p.grad, offset = None, offset + p.numel()  # the local gradients are used up
        if self.stage == 1:                           # ZeRO-1: every rank gets the whole sum
            dist.all_reduce(grads)
            mine = grads.view(self.world, -1)[self.rank]
        else:                                         # ZeRO-2: only my shard's sum arrives
            mine = torch.empty_like(grads[:flat.numel() // self.world])
            dist.reduce_scatter_single(mine, grads)
        mine /= self.world
        for (piece, (lo, hi)), has_grad in zip(pieces, got.tolist()):
            piece.grad = mine[lo:hi] if has_grad else None


class ZeRO(ShardedOptimizer):
    """Chapter 3's first version, kept for old code: ``ZeRO(model, stage=2, lr=1e-3)`` = Adam."""

    def __init__(self, model, stage=2, lr=1e-3):
        super().__init__(model.parameters(), torch.optim.Adam, stage=stage, lr=lr)
