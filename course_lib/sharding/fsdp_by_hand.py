"""FSDP (ZeRO-3) by hand: each unit's parameters live as one flat shard per rank (chapter 3).

The notebook types :class:`FSDPUnit` and :class:`FSDPByHand` in a cell; this is their library
copy. A *unit* is a transformer block, plus the root (embeddings, final norm, head, as FSDP2's
``fully_shard(model)``). Each keeps a flat shard (a ``Parameter``, the optimizer's fp32 master)
and a flat full buffer that owns **no bytes** except while needed: :meth:`FSDPUnit.pre_forward`
all-gathers the shards into it (cast to ``param_dtype``) before the unit's forward and again
before its backward; after the forward the bytes are freed (``untyped_storage().resize_(0)``, as
FSDP2 does); :meth:`FSDPUnit.post_backward` reduce-scatters the full gradient (fp32) into the
shard's average gradient and frees it. The root is gathered twice too (3Ψ per step). Tied
parameters must be in one unit; gradient accumulation over several backwards is not supported
(each backward overwrites the shard's grad).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_leaves

from course_lib.sharding.strategies import shard_units

__all__ = ["FSDPUnit", "FSDPByHand"]


class FSDPUnit:
    """One unit: the flat shard this rank owns, and the full flat buffer gathered on demand."""

    def __init__(self, slots, param_dtype=None):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        params = list(dict.fromkeys(p for _, _, _, p in slots))   # tied weights: once
        self.names = [next(q for q, _, _, s in slots if s is p) for p in params]
        numel = sum(p.numel() for p in params)
        flat = torch.zeros(-(-numel // self.world) * self.world, dtype=params[0].dtype,
                           device=params[0].device)
        torch.cat([p.detach().flatten() for p in params], out=flat[:numel])
        self.shard = nn.Parameter(flat.view(self.world, -1)[self.rank].clone())
        self.full = torch.empty_like(flat, dtype=param_dtype or flat.dtype).requires_grad_()
        self.full_bytes = self.full.untyped_storage().nbytes()
        self.free()
        self.sizes = [p.numel() for p in params] + [flat.numel() - numel]   # + the padding
        index = {id(p): i for i, p in enumerate(params)}
        self.slots = [(module, name, index[id(p)], p.shape) for _, module, name, p in slots]
        for _, module, name, _ in slots:
            del module._parameters[name]              # the module now reads our views

    def free(self):
        self.full.untyped_storage().resize_(0)

    def use_full(self):
        """Point the modules at views of the full buffer (their gradients flow into full.grad)."""
        views = torch.split(self.full, self.sizes)
        for module, name, index, shape in self.slots:
            setattr(module, name, views[index].view(shape))

    def pre_forward(self):
        """Give the full buffer its bytes back and all-gather every rank's shard into it."""
        self.full.untyped_storage().resize_(self.full_bytes)  # .data: a write autograd must not see
        dist.all_gather_single(self.full.data, self.shard.detach().to(self.full.dtype))

    def post_backward(self):
        """Reduce-scatter the full gradient (in fp32) into my shard's average; free the full copies."""
        grad = torch.empty_like(self.shard)
        dist.reduce_scatter_single(grad, self.full.grad.to(grad.dtype))
        self.shard.grad = grad.div_(self.world)
        self.full.grad = None
        self.free()


class FSDPByHand(nn.Module):
    """ZeRO-3 by hand: ``module``'s blocks, and the rest, become :class:`FSDPUnit` s."""

    unit_class = FSDPUnit

    def __init__(self, module, *, param_dtype=None):
        super().__init__()
        if param_dtype is not None and not (isinstance(param_dtype, torch.dtype)
                                            and param_dtype.is_floating_point):
            raise TypeError(f"param_dtype must be a floating torch.dtype or None, got {param_dtype!r}")
        self.module, self.units, claimed = module, [], set()
        prefixes = {m: name for name, m in module.named_modules()}
        for unit_module in [*shard_units(module), module]:   # the root last: what is left
            slots = [(f"{prefix}.{name}".lstrip("."), owner, name, p)
                     for prefix, owner in unit_module.named_modules(prefix=prefixes[unit_module])
                     for name, p in owner._parameters.items() if p is not None]
            if any(id(p) in claimed for *_, p in slots):
                raise ValueError("a parameter is shared by two units (tied weights): FSDP by "
                                 "hand, like FSDP2, needs tied modules in one unit")
            claimed |= {id(p) for *_, p in slots}
            if slots:
                self._add_unit(unit_module, self.unit_class(slots, param_dtype))
        self.shards = nn.ParameterList([unit.shard for unit in self.units])  # what the optimizer sees

    def _add_unit(self, unit_module, unit):
        self.units.append(unit)
        unit_module.register_forward_pre_hook(lambda m, args: self._pre_forward(unit))
        unit_module.register_forward_hook(lambda m, args, out: self._post_forward(unit, out))
        unit.full.register_post_accumulate_grad_hook(lambda full: unit.post_backward())

    def _pre_forward(self, unit):
        unit.pre_forward()
        unit.use_full()

    def _post_forward(self, unit, output):
        unit.free()                                   # the graph keeps the views, not the bytes
        needs_grad = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)
                      and t.requires_grad]
        if needs_grad:                                # just before this unit's backward: gather
            register_multi_grad_hook(needs_grad, lambda grads: unit.pre_forward(), mode="any")

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
