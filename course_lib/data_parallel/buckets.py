"""DDP by hand, as torch's ``DistributedDataParallel`` does it (chapter 2): read it top to bottom.

:func:`~course_lib.data_parallel.by_hand.average_gradients` waits for the whole backward, then
all-reduces one tensor at a time. DDP packs the gradients into **buckets** and launches a
bucket's all-reduce *while backward still computes the earlier layers*:
:func:`make_buckets` is DDP's rule (walk the parameters last first, close a bucket once it holds
at least ``cap_bytes``, never split one); :class:`DDPByHand` puts a hook on every parameter that
requires a gradient, counting its bucket down; the last one starts
``all_reduce(flat, async_op=True)`` and returns at once. ``finish_gradient_synchronization()``
waits, averages and copies back into ``.grad``. :mod:`course_lib.data_parallel.measure` checks
it against torch's DDP on real ranks.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from course_lib.data_parallel.by_hand import broadcast_parameters

__all__ = ["make_buckets", "ddp_buckets", "DDP_BUCKET_BYTES", "DDP_FIRST_BUCKET_BYTES", "DDPByHand"]

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb = 25
DDP_FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES if dist.is_available() else 2**20  # 1 MiB


def make_buckets(params, cap_bytes):
    """Group ``params`` into buckets of at least ``cap_bytes`` (the last may hold less), last first."""
    buckets, current, size = [], [], 0
    for p in reversed(params):               # backward produces the last layer's gradients first
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= cap_bytes:                # full: close it (a tensor is never split)
            buckets.append(current)
            current, size = [], 0
    if current:                              # the first parameters' bucket: flush it too
        buckets.append(current)
    return buckets


def ddp_buckets(grad_bytes: int) -> int:
    """All-reduces torch's DDP makes per step once it has rebuilt its buckets (from the second
    step on; the first puts every gradient in one): a first bucket of 1 MiB, then 25 MiB ones."""
    return 1 + -(-max(0, grad_bytes - DDP_FIRST_BUCKET_BYTES) // DDP_BUCKET_BYTES)


class DDPByHand(nn.Module):
    """Wrap ``module`` as torch's DDP does: each bucket is all-reduced as soon as it is full.

    ``.module`` is the model; rank 0's parameters and buffers are broadcast here (buffers only
    here, as torch's DDP with ``forward_sync_buffers=False``). Buckets of about
    ``bucket_cap_mb`` MiB (``None``: one per tensor) hold the parameters that require a gradient
    (a tied one once), in their dtype and device. Call :meth:`finish_gradient_synchronization` after backward,
    before the step; backward passes under :meth:`no_sync` only accumulate. A parameter that
    got no gradient is an error naming it (torch's DDP needs ``find_unused_parameters=True``).
    """

    def __init__(self, module: nn.Module, *, bucket_cap_mb: float | None = 25.0):
        super().__init__()
        if bucket_cap_mb is not None and not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0 or None, got {bucket_cap_mb!r}")
        self.module = module
        broadcast_parameters(module)                              # same start everywhere
        params = [p for p in module.parameters() if p.requires_grad]   # frozen: no hook
        cap = 0 if bucket_cap_mb is None else bucket_cap_mb * 2 ** 20    # 0: one per tensor
        self.buckets = make_buckets(params, cap)
        self.names = {id(p): name for name, p in module.named_parameters()}
        self.require_sync = True                                  # False inside no_sync()
        self._reset()
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i, p))

    def _reset(self):
        self.waiting = [{id(p) for p in bucket} for bucket in self.buckets]  # grads to come
        self.launched = []                                # (bucket, flat gradients, work handle)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate into ``.grad``; the next one outside syncs."""
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True

    def _grad_ready(self, i, param):
        """Autograd calls this once ``param.grad`` holds the gradient accumulated so far."""
        if not self.require_sync:                         # under no_sync(): stay local
            return
        self.waiting[i].discard(id(param))
        if not self.waiting[i]:                           # bucket i is full: launch, don't wait
            flat = torch.cat([p.grad.flatten() for p in self.buckets[i]])
            self.launched.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish_gradient_synchronization(self):
        """After backward, before the step: wait for every bucket, average, copy into ``.grad``."""
        unused = [self.names[id(p)] for bucket, waiting in zip(self.buckets, self.waiting)
                  for p in bucket if id(p) in waiting]
        for i, flat, work in self.launched:
            work.wait()                                   # now flat holds the sum over ranks
            flat /= dist.get_world_size()
            for p, g in zip(self.buckets[i], flat.split([p.numel() for p in self.buckets[i]])):
                p.grad.copy_(g.view_as(p))
        self._reset()
        if unused:
            raise RuntimeError(
                f"{len(unused)} parameter(s) got no gradient in the last backward outside "
                f"no_sync(), so their buckets were never all-reduced: {', '.join(unused[:5])}. "
                "Use them in forward, or freeze them with requires_grad_(False).")
