"""What a rank's model states take as stored: the bytes of its local parameters, gradients and
optimizer states (a DTensor counts its local shard), each storage once.

Light to import (no FSDP2 or DTensor import): :mod:`course_lib.composition.measure`'s notebook
side uses it, and :mod:`course_lib.composition.compose` hands the same functions on.
"""
from __future__ import annotations

import torch

__all__ = ["local_bytes", "state_bytes"]


def local_bytes(tensors) -> int:
    """Bytes of the distinct storages behind the local parts of ``tensors`` (DTensor → local)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """This rank's model-state bytes as stored: params, grads, optimizer state and their sum."""
    params = list(model.parameters())
    measured = {"params": local_bytes(params), "grads": local_bytes(p.grad for p in params),
                "optimizer": local_bytes(v for s in optimizer.state.values() for v in s.values())}
    measured["model_states"] = sum(measured.values())
    return measured
