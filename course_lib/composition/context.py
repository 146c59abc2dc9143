"""Context parallelism by hand: causal ring attention over the ranks of a group.

The sequence is cut into ``cp`` contiguous chunks, one per rank; each rank keeps its queries and
passes its keys/values around a ring (``batch_isend_irecv``). At ring step t rank i holds the K/V
chunk of rank ``(i - t) mod cp``: earlier chunks are attended in full, its own causally, later
ones not at all. Partial results merge with the log-sum-exp trick (flash attention's online
softmax), so no rank holds the full sequence's K/V or a score matrix larger than chunk × chunk.
Training (:class:`RingAttention`, :func:`cp_attention_grad_rank`): the backward runs the ring
again, each K/V chunk travelling with its gradient accumulator; every rank adds its queries'
share (flash attention's softmax backward from the saved output and log-sum-exp), and after
``cp`` passes dK/dV arrive back at the chunk's owner.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

__all__ = ["ring_attention", "attention_block", "RingAttention", "cp_attention_rank",
           "cp_attention_grad_rank", "cp_predicted_bytes"]


def attention_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / √d) v for one (query chunk, key chunk) pair, and each row's log-sum-exp."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if causal:
        mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def _neighbours(group) -> tuple[int, int, int, int]:
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    nxt, prv = dist.get_global_rank(group, (rank + 1) % cp) if group else (rank + 1) % cp, \
        dist.get_global_rank(group, (rank - 1) % cp) if group else (rank - 1) % cp
    return rank, cp, nxt, prv


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                   log: dict | None = None) -> torch.Tensor:
    """Causal attention of this rank's query chunk over the whole sequence, K/V by a ring."""
    return _ring_forward(q, k, v, group, log)[0]


def _ring_forward(q, k, v, group=None, log: dict | None = None):
    rank, cp, nxt, prv = _neighbours(group)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"))
    kv = torch.stack([k, v])
    for step in range(cp):
        src = (rank - step) % cp
        if step < cp - 1:   # start passing the chunk on while computing with it
            incoming = torch.empty_like(kv)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, nxt, group),
                                           dist.P2POp(dist.irecv, incoming, prv, group)])
        if src <= rank:
            block_out, block_lse = attention_block(q, kv[0], kv[1], causal=src == rank)
            new_lse = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - new_lse).unsqueeze(-1) + \
                block_out * torch.exp(block_lse - new_lse).unsqueeze(-1)
            lse = new_lse
        if log is not None and step == 0:  # the peak: q, own k/v, a chunk in flight, out, lse
            held = [q, kv, out, lse] + ([incoming] if cp > 1 else [])
            log["activation_bytes"] = sum(t.numel() * t.element_size() for t in held)
            log["score_bytes"] = q.size(0) * q.size(1) * q.size(2) * kv.size(-2) * 4
        if step < cp - 1:
            for req in reqs:
                req.wait()
            kv = incoming
    return out, lse


def _shift(tensor: torch.Tensor, nxt: int, prv: int, group) -> torch.Tensor:
    """Send ``tensor`` to the next rank of the ring; return what the previous one sent."""
    incoming = torch.empty_like(tensor)
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, nxt, group),
                                       dist.P2POp(dist.irecv, incoming, prv, group)]):
        req.wait()
    return incoming


class RingAttention(torch.autograd.Function):
    """Causal ring attention with a ring backward: ``RingAttention.apply(q, k, v, group)``."""

    @staticmethod
    def forward(ctx, q, k, v, group=None):
        out, lse = _ring_forward(q, k, v, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rank, cp, nxt, prv = _neighbours(ctx.group)
        scale = 1 / math.sqrt(q.size(-1))
        delta = (dout * out).sum(-1, keepdim=True)          # rowsum(dO ∘ O) of softmax's backward
        dq = torch.zeros_like(q)
        kv, dkv = torch.stack([k, v]), torch.zeros(2, *k.shape)
        for step in range(cp):
            src = (rank - step) % cp
            if src <= rank:                                  # this rank's queries saw chunk src
                scores = (q @ kv[0].transpose(-2, -1)) * scale
                if src == rank:
                    mask = torch.ones(q.size(-2), kv.size(-2), dtype=torch.bool).tril()
                    scores = scores.masked_fill(~mask, float("-inf"))
                p = torch.exp(scores - lse.unsqueeze(-1))      # the forward's probabilities
                dkv[1] += p.transpose(-2, -1) @ dout
                ds = p * (dout @ kv[1].transpose(-2, -1) - delta)
                dq += ds @ kv[0] * scale
                dkv[0] += ds.transpose(-2, -1) @ q * scale
            if step < cp - 1:
                kv = _shift(kv, nxt, prv, ctx.group)
            dkv = _shift(dkv, nxt, prv, ctx.group) if cp > 1 else dkv
        return dq, dkv[0], dkv[1], None


def _qkv(batch: int, heads: int, seq: int, head_dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, head_dim, generator=gen) for _ in range(3)]


def cp_attention_rank(shape: tuple[int, int, int, int], seed: int = 0) -> dict:
    """Inside a rank: this rank's chunk of q, k, v (of one seeded full-sequence tensor) through
    :func:`ring_attention`; returns the output chunk and the bytes it held."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    b, a, s, d = shape
    q, k, v = (t.chunk(cp, dim=2)[rank].contiguous() for t in _qkv(b, a, s, d, seed))
    log = {}
    out = ring_attention(q, k, v, log=log)
    return {"rank": rank, "out": out, **log}


def cp_attention_grad_rank(shape: tuple[int, int, int, int], seed: int = 0) -> dict:
    """Inside a rank: forward and backward of :class:`RingAttention` on this rank's chunks (the
    loss is the sum of the output times a seeded weight); returns the chunks' dq, dk, dv."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    b, a, s, d = shape
    q, k, v = (t.chunk(cp, dim=2)[rank].contiguous().requires_grad_()
               for t in _qkv(b, a, s, d, seed))
    weight = torch.randn(b, a, s, d, generator=torch.Generator().manual_seed(seed + 1))
    (RingAttention.apply(q, k, v) * weight.chunk(cp, dim=2)[rank]).sum().backward()
    return {"rank": rank, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def cp_predicted_bytes(shape: tuple[int, int, int, int], cp: int) -> dict[str, int]:
    """Per rank: q, k, v, one K/V chunk in flight and the output (each b·a·s/cp·d fp32) plus one
    log-sum-exp per query row; the block score matrix b·a·(s/cp)² (freed after each block)."""
    b, a, s, d = shape
    chunk = b * a * (s // cp) * d * 4
    return {"activation_bytes": (4 + (2 if cp > 1 else 0)) * chunk + b * a * (s // cp) * 4,
            "score_bytes": b * a * (s // cp) ** 2 * 4}
