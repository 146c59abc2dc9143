"""The cross-rank divergence checker: do all ranks hold bit-identical weights and buffers?

Data-parallel ranks must stay identical; a per-rank seed, a buffer nobody synchronises or an
optimizer step on one rank only makes them drift apart without any error. Each rank hashes the
bytes of every tensor (so a swap of two entries shows, unlike a sum), the hashes are all-gathered
as one int64 tensor (one collective, 8 bytes per tensor per rank), and the first name whose hash
differs between ranks is reported with the ranks that disagree with rank 0.
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["tensor_hash", "named_state", "first_divergence"]


def tensor_hash(t: torch.Tensor) -> int:
    """A signed 64-bit hash of ``t``'s bytes (its dtype and shape included)."""
    data = t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    digest = hashlib.blake2b(data + f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little", signed=True)


def named_state(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters, then buffers (BatchNorm statistics...), in the module's order."""
    return list(model.named_parameters()) + list(model.named_buffers())


def first_divergence(model: nn.Module, group=None) -> tuple[str, list[int]] | None:
    """``(name, ranks that differ from rank 0)`` for the first tensor not equal on every rank.

    ``None`` when every rank holds the same bytes. Call it on every rank (it is a collective).
    """
    named = named_state(model)
    mine = torch.tensor([tensor_hash(t) for _, t in named], dtype=torch.int64)
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(named)]), group=group)
    if len({int(s) for s in sizes}) != 1:
        raise ValueError(f"the ranks have different numbers of tensors: {[int(s) for s in sizes]}")
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    table = torch.stack(gathered)            # (ranks, tensors)
    for i, (name, _) in enumerate(named):
        differ = [r for r in range(world) if table[r, i] != table[0, i]]
        if differ:
            return name, differ
    return None
