"""FSDP (ZeRO-3) by hand: each unit's parameters live as one flat shard per rank (chapter 3).

The notebook types :class:`FSDPUnit` and :class:`FSDPByHand` in a cell; this is their library
copy. A *unit* is a transformer block, plus the root (what is left, as FSDP2's
``fully_shard(model)``). Each rank keeps its **shard** of the unit (flat, padded, in the
parameters' dtype: the fp32 master weights); the module's parameters stay registered as 1-D views
of their elements in it (FSDP1's ``use_orig_params=True`` layout), so ``named_parameters()``,
``state_dict()`` and optimizers see the shards. A **full** buffer in ``param_dtype`` owns bytes
only while the unit computes: all-gathered before its forward and again before its backward,
freed after; the full gradient is reduce-scattered (fp32) into the shard's. Tied parameters must
share a unit; :func:`fsdp_full_state_dict` gathers every full parameter (call it on every rank).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_leaves

from course_lib.sharding.strategies import shard_units

__all__ = ["FSDPUnit", "FSDPByHand", "fsdp_full_state_dict"]


class FSDPUnit:
    """One unit: the flat shard this rank owns, and the full flat buffer gathered on demand."""

    def __init__(self, slots, param_dtype=None):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.params = list(dict.fromkeys(p for _, _, _, p in slots))   # tied weights: once
        self.names = [next(q for q, _, _, s in slots if s is p) for p in self.params]
        numel = sum(p.numel() for p in self.params)
        flat = torch.zeros(-(-numel // self.world) * self.world, dtype=self.params[0].dtype,
                           device=self.params[0].device)
        torch.cat([p.detach().flatten() for p in self.params], out=flat[:numel])
        self.shard = flat.view(self.world, -1)[self.rank].clone()   # my elements, their dtype
        self.full = torch.empty_like(flat, dtype=param_dtype or flat.dtype).requires_grad_()
        self.full_bytes = self.full.untyped_storage().nbytes()
        self.free()
        self.sizes = [p.numel() for p in self.params] + [flat.numel() - numel]  # + the padding
        self.shapes = [p.shape for p in self.params]
        index = {id(p): i for i, p in enumerate(self.params)}
        self.slots = [(module, name, index[id(p)]) for _, module, name, p in slots]
        self.pieces, offset, start = [], 0, self.rank * self.shard.numel()
        for p in self.params:            # each parameter stays registered: my piece of it
            lo, hi = (min(max(x - start, 0), self.shard.numel()) for x in (offset, offset + p.numel()))
            p.data, offset = self.shard[lo:hi], offset + p.numel()
            self.pieces.append((lo, hi))

    def free(self):
        self.full.untyped_storage().resize_(0)

    def use_full(self):
        """Point the modules at views of the full buffer (their gradients flow into full.grad)."""
        views = torch.split(self.full, self.sizes)
        for module, name, index in self.slots:
            module.__dict__[name] = views[index].view(self.shapes[index])  # hides the piece

    def use_shards(self):
        """The modules read their registered parameters (the pieces of my shard) again."""
        for module, name, _ in self.slots:
            module.__dict__.pop(name, None)

    def pre_forward(self):
        """Give the full buffer its bytes back and all-gather every rank's shard into it."""
        self.full.untyped_storage().resize_(self.full_bytes)  # .data: a write autograd must not see
        dist.all_gather_single(self.full.data, self.shard.to(self.full.dtype))

    def post_backward(self):
        """Reduce-scatter the full gradient (in fp32) into my shard's average; free the full copies."""
        grad = torch.empty_like(self.shard)
        dist.reduce_scatter_single(grad, self.full.grad.to(grad.dtype))
        self.shard.grad = grad.div_(self.world)
        self.full.grad = None
        self.free()


class FSDPByHand(nn.Module):
    """ZeRO-3 by hand: ``module``'s blocks, and the rest, become :class:`FSDPUnit` s.

    Each rank keeps its shard of every parameter in the parameter's dtype (the fp32 master), as
    the module's registered parameters (1-D pieces); the full parameters exist in ``param_dtype``
    only while a unit computes; gradients are reduced in the shard's dtype."""

    unit_class = FSDPUnit

    def __init__(self, module, *, param_dtype=None):
        super().__init__()
        if param_dtype is not None and not (isinstance(param_dtype, torch.dtype)
                                            and param_dtype.is_floating_point):
            raise TypeError(f"param_dtype must be a floating torch.dtype or None, got {param_dtype!r}")
        self.module, self.units, claimed, taken = module, [], set(), set()
        prefixes = {m: name for name, m in module.named_modules()}
        for unit_module in [*shard_units(module), module]:   # the root last: what is left
            owners = [(prefix, owner) for prefix, owner in
                      unit_module.named_modules(prefix=prefixes[unit_module])
                      if owner not in taken or unit_module is not module]  # root: the rest
            slots = [(f"{prefix}.{name}".lstrip("."), owner, name, p) for prefix, owner in owners
                     for name, p in owner._parameters.items() if p is not None]
            if any(id(p) in claimed for *_, p in slots):
                raise ValueError("a parameter is shared by two units (tied weights): FSDP by "
                                 "hand, like FSDP2, needs tied modules in one unit")
            claimed |= {id(p) for *_, p in slots}
            taken |= {owner for _, owner in owners}
            if slots:
                self._add_unit(unit_module, self.unit_class(slots, param_dtype))

    def _add_unit(self, unit_module, unit):
        self.units.append(unit)
        unit_module.register_forward_pre_hook(lambda m, args: self._pre_forward(unit))
        unit_module.register_forward_hook(lambda m, args, out: self._post_forward(unit, out))
        unit.full.register_post_accumulate_grad_hook(lambda full: self._post_backward(unit))

    def _pre_forward(self, unit):
        unit.pre_forward()
        unit.use_full()

    def _post_forward(self, unit, output):
        unit.free()                                   # the graph keeps the views, not the bytes
        unit.use_shards()
        needs_grad = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)
                      and t.requires_grad]
        if needs_grad:                                # just before this unit's backward: gather
            register_multi_grad_hook(needs_grad, lambda grads: unit.pre_forward(), mode="any")

    def _post_backward(self, unit):
        unit.post_backward()
        grad, unit.shard.grad = unit.shard.grad, None
        for p, (lo, hi) in zip(unit.params, unit.pieces):
            p.grad = grad[lo:hi]                      # each parameter's piece of the average

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def fsdp_full_state_dict(fsdp: FSDPByHand) -> dict[str, torch.Tensor]:
    """Every parameter of the wrapped module, full and in its own dtype, all-gathered from the
    shards: ``{name: tensor}`` on every rank (a collective: call it on every rank)."""
    if not hasattr(fsdp, "units"):                  # the notebook's own class is welcome too
        raise TypeError(f"expected an FSDPByHand (a module with .units), got {type(fsdp).__name__}")
    out = {}
    for unit in fsdp.units:
        flat = torch.empty(unit.shard.numel() * unit.world, dtype=unit.shard.dtype,
                           device=unit.shard.device)
        dist.all_gather_single(flat, unit.shard)
        pieces = torch.split(flat, unit.sizes)            # the parameters, then the padding
        out.update({name: piece.view(shape).clone()
                    for name, piece, shape in zip(unit.names, pieces, unit.shapes)})
    return out
