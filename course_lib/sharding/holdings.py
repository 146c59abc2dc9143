"""Which bytes sit on which rank under ZeRO-0/1/2/3, read from each rank's tensors (chapter 3).

:func:`holdings_rank` trains one step per stage with the chapter's own classes (0: a replica
with chapter 2's gradient averaging; 1, 2: :class:`ShardedOptimizer`; 3: :class:`FSDPByHand`)
and reports, per category, the ranges of the model's flat parameter index that this rank holds:
where a parameter is a view of the flat buffer, where a gradient's storage lies, which pieces
have optimizer state. Stage 3 also logs every all-gather, free and reduce-scatter of its units,
with the full-parameter bytes alive after each. :func:`zero_holdings` runs it on ``world`` ranks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.common.checks import positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.data_parallel.by_hand import average_gradients, broadcast_parameters
from course_lib.launcher.launch import run
from course_lib.sharding.fsdp_by_hand import FSDPByHand
from course_lib.sharding.zero_by_hand import ShardedOptimizer

__all__ = ["holdings_rank", "zero_holdings", "STAGES"]

STAGES = (0, 1, 2, 3)
_CATEGORIES = ("params", "grads", "optimizer")


def _merge(ranges) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _nbytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view counts its whole storage once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _offset(t: torch.Tensor, base: torch.Tensor) -> int:
    return (t.data_ptr() - base.data_ptr()) // t.element_size()


def _replica(model, opt) -> dict:
    held, tensors, offset = {k: [] for k in _CATEGORIES}, {k: [] for k in _CATEGORIES}, 0
    for p in model.parameters():
        span = (offset, offset + p.numel())
        held["params"].append(span)
        tensors["params"].append(p)
        if p.grad is not None:
            held["grads"].append(span)
            tensors["grads"].append(p.grad)
        state = [t for t in opt.state.get(p, {}).values() if torch.is_tensor(t)]
        if state:
            held["optimizer"].append(span)
            tensors["optimizer"] += state
        offset += p.numel()
    return {"held": held, "tensors": tensors, "units": []}


def _sharded(opt: ShardedOptimizer, psi: int) -> dict:
    held, tensors = {k: [] for k in _CATEGORIES}, {k: [] for k in _CATEGORIES}
    for flat, params, pieces in opt.flats:
        for p in params:                                  # views of the flat buffer
            held["params"].append((_offset(p, flat), _offset(p, flat) + p.numel()))
            tensors["params"].append(p)
        for piece, _ in pieces:
            start = _offset(piece, flat)
            if piece.grad is not None and piece.numel():  # where its gradient's storage lies
                g = piece.grad
                first = start - (g.data_ptr() - g.untyped_storage().data_ptr()) // g.element_size()
                held["grads"].append((first, min(psi, first + g.untyped_storage().nbytes()
                                                 // g.element_size())))
                tensors["grads"].append(g)
            state = [t for t in opt.inner.state.get(piece, {}).values() if torch.is_tensor(t)]
            tensors["optimizer"] += state                 # an empty piece has a step, too
            if state and piece.numel():
                held["optimizer"].append((start, start + piece.numel()))
    return {"held": held, "tensors": tensors, "units": []}


def _logged(fsdp_class: type) -> type:
    """``fsdp_class`` whose units note each all-gather, free and reduce-scatter in ``log``."""
    base = fsdp_class.unit_class

    class LoggedUnit(base):
        log: list | None = None

        def pre_forward(self):
            super().pre_forward()
            self._note("all-gather")

        def free(self):
            super().free()
            self._note("free")

        def post_backward(self):
            self._note("reduce-scatter")
            super().post_backward()

        def _note(self, kind: str) -> None:
            if self.log is not None:                      # the bytes its full buffer has now
                self.log.append((kind, self, self.full.untyped_storage().nbytes()))

    return type(f"Logged{fsdp_class.__name__}", (fsdp_class,), {"unit_class": LoggedUnit})


def _unit_name(unit: FSDPUnit) -> str:
    prefixes = {".".join(name.split(".")[:2]) for name in unit.names}
    return prefixes.pop() if len(prefixes) == 1 and next(iter(prefixes)).startswith("blocks.") \
        else "root"


def _fsdp(fsdp: FSDPByHand, opt) -> dict:
    held, tensors, units, base = {k: [] for k in _CATEGORIES}, {k: [] for k in _CATEGORIES}, [], 0
    for unit in fsdp.units:
        numel, length = sum(unit.sizes[:-1]), unit.shard.numel()   # real elements, shard length
        span = (base + min(unit.rank * length, numel), base + min((unit.rank + 1) * length, numel))
        held["params"].append(span)
        tensors["params"].append(unit.shard)
        if unit.full.untyped_storage().nbytes():
            held["params"].append((base, base + numel))
            tensors["params"].append(unit.full)
        grads = [p.grad for p in unit.params if p.grad is not None]   # pieces of one flat grad
        if grads:
            held["grads"].append(span)
            tensors["grads"] += grads
        state = [t for p in unit.params for t in opt.state.get(p, {}).values() if torch.is_tensor(t)]
        if state:
            held["optimizer"].append(span)
            tensors["optimizer"] += state
        units.append((_unit_name(unit), base, base + numel))
        base += numel
    return {"held": held, "tensors": tensors, "units": units}


def holdings_rank(config="tiny", batch: tuple[int, int] = (2, 16), stages=STAGES,
                  seed: int = 0, sharded_class: type = ShardedOptimizer,
                  fsdp_class: type = FSDPByHand) -> dict:
    """One Adam step per stage on this rank; what it then holds (see the module docstring)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    config = get_config(config)
    out = {}
    for stage in stages:
        torch.manual_seed(seed + rank)                    # apart on purpose: the broadcast joins
        model = GPT(config)
        broadcast_parameters(model)
        psi = sum(p.numel() for p in model.parameters())
        inputs, targets = get_batch(*batch, seed=seed, step=0, rank=rank, world_size=world)
        events = []
        if stage == 3:
            logged = _logged(fsdp_class)
            fsdp = logged(model)
            opt = torch.optim.Adam(fsdp.parameters(), lr=1e-3)
            logged.unit_class.log, forward = events, fsdp
        elif stage in (1, 2):
            opt = sharded_class(model.parameters(), torch.optim.Adam, stage=stage, lr=1e-3)
            forward = model
        else:
            opt, forward = torch.optim.Adam(model.parameters(), lr=1e-3), model
        GPT.loss(forward(inputs % config.vocab_size), targets % config.vocab_size).backward()
        if stage == 0:
            average_gradients(model)
        opt.step()
        if stage == 3:
            logged.unit_class.log = None
        got = (_fsdp(fsdp, opt) if stage == 3 else _sharded(opt, psi) if stage else
               _replica(model, opt))
        out[stage] = {"psi": psi, "units": got["units"],
                      "held": {k: _merge(v) for k, v in got["held"].items()},
                      "bytes": {k: _nbytes(v) for k, v in got["tensors"].items()},
                      "events": _replay(events, fsdp) if stage == 3 else []}
    return out


def _replay(events, fsdp) -> list[tuple[str, int, int]]:
    """(kind, unit index, full-parameter bytes of all units after it), from the storages."""
    index = {unit: i for i, unit in enumerate(fsdp.units)}
    alive, out = {}, []
    for kind, unit, nbytes in events:
        alive[unit] = nbytes
        out.append((kind, index[unit], sum(alive.values())))
    return out


def zero_holdings(world: int = 4, config="tiny", batch: tuple[int, int] = (2, 16),
                  stages=STAGES, sharded_class: type = ShardedOptimizer,
                  fsdp_class: type = FSDPByHand) -> dict[int, list[dict]]:
    """``{stage: [rank 0's holdings, rank 1's, ...]}`` from one real launch on ``world`` ranks
    (``sharded_class`` and ``fsdp_class``: the notebook's own classes, shipped by value)."""
    positive_int(world, "world")
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise ValueError(f"stages must be among {STAGES}, got {tuple(stages)!r}")
    get_config(config)
    for cls, role in ((sharded_class, "sharded_class"), (fsdp_class, "fsdp_class")):
        if not isinstance(cls, type):
            raise TypeError(f"{role} must be the class itself (no parentheses), got {cls!r}")
    ranks = run(holdings_rank, world, config, batch, tuple(stages), 0, sharded_class, fsdp_class,
                threads=1)
    return {stage: [r[stage] for r in ranks] for stage in stages}
