"""Expert parallelism by hand: a top-k mixture-of-experts layer whose tokens travel by all_to_all.

:class:`MoE` is the single-process layer (a router picks ``top_k`` of ``n_experts`` MLPs per
token, outputs mixed by the renormalised router weights). :func:`ep_forward` runs the same layer
with the experts split over the ranks of a group: each rank routes its own tokens, sends every
(token, expert) pair to the rank owning the expert (``all_to_all``), the owners run their
experts, and a second ``all_to_all`` brings the results home. Both exchanges go through
``torch.distributed.nn.functional.all_to_all_single``, which has a backward (another all_to_all).
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_to_all_single as _a2a

__all__ = ["MoE", "route", "dispatch", "ep_forward", "owner"]


class MoE(nn.Module):
    """``router`` (d → n_experts, no bias) and ``experts[e]``: Linear(d, hidden), GELU, Linear."""

    def __init__(self, d_model: int = 32, n_experts: int = 4, hidden: int = 64, top_k: int = 2) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(),
                                                   nn.Linear(hidden, d_model))
                                     for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self, x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (experts == e).nonzero(as_tuple=True)
            out = out.index_add(0, token, weights[token, slot, None] * expert(x[token]))
        return out


def route(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: (weights, expert ids), both ``(tokens, top_k)``; weights sum to 1 per token."""
    weights, experts = F.softmax(moe.router(x), dim=-1).topk(moe.top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), experts


def all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=None):
    """all_to_all with a backward (torch marks this spelling deprecated; its replacement in
    ``_functional_collectives`` is private): row ``input_split_sizes[r]`` blocks go to rank r."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return _a2a(output, input, output_split_sizes, input_split_sizes, group=group)


def owner(expert: torch.Tensor, n_experts: int, ep: int) -> torch.Tensor:
    """The rank holding each expert id: experts are split in contiguous blocks of n_experts/ep."""
    return expert // (n_experts // ep)


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, ep: int, group=None):
    """Send every (token, expert) pair to the expert's owner with two all_to_alls.

    Returns ``(received rows, their expert ids, order, send_counts, recv_counts)``: ``order``
    sorts the flattened (token, slot) pairs by destination rank (stable), ``send_counts[r]`` rows
    go to rank r, ``recv_counts[r]`` rows came from rank r.
    """
    flat = experts.flatten()
    order = torch.argsort(owner(flat, n_experts, ep), stable=True)
    send_counts = torch.bincount(owner(flat, n_experts, ep), minlength=ep)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)      # how many rows to expect
    send, recv = send_counts.tolist(), recv_counts.tolist()
    rows = x.repeat_interleave(experts.size(1), dim=0)[order]
    received = all_to_all_single(x.new_empty(sum(recv), x.size(1)), rows, recv, send, group=group)
    ids = flat[order].new_empty(sum(recv))
    dist.all_to_all_single(ids, flat[order], recv, send, group=group)  # which expert for each row
    return received, ids, order, send_counts, recv_counts


def ep_forward(moe: MoE, x: torch.Tensor, ep: int, group=None, log: dict | None = None) -> torch.Tensor:
    """The MoE forward with this rank holding experts ``rank*E/ep ... (rank+1)*E/ep - 1`` only.

    ``moe.experts`` holds every expert's module, but only the local ones are used (and should be
    the only ones kept; :func:`course_lib.composition.measure.train_ep` keeps just those).
    ``log`` (a dict) receives tokens per local expert and the bytes each all_to_all sent to
    other ranks.
    """
    n_experts, rank = len(moe.experts), dist.get_rank(group)
    weights, experts = route(moe, x)
    received, ids, order, send_counts, recv_counts = dispatch(x, experts, n_experts, ep, group)
    out_rows = torch.zeros_like(received)
    first = rank * (n_experts // ep)
    for e in range(first, first + n_experts // ep):
        rows = (ids == e).nonzero(as_tuple=True)[0]
        out_rows = out_rows.index_add(0, rows, moe.experts[e](received[rows]))
        if log is not None:
            log.setdefault("tokens_per_expert", {})[e] = int(rows.numel())
    back = all_to_all_single(x.new_empty(int(send_counts.sum()), x.size(1)), out_rows,
                             send_counts.tolist(), recv_counts.tolist(), group=group)
    if log is not None:
        row = x.size(1) * x.element_size()
        sent = int(send_counts.sum() - send_counts[rank]) * row
        returned = int(recv_counts.sum() - recv_counts[rank]) * row
        log["all_to_all_bytes"] = log.get("all_to_all_bytes", 0) + sent + returned
    token = torch.arange(x.size(0)).repeat_interleave(experts.size(1))[order]
    return torch.zeros_like(x).index_add(0, token, weights.flatten()[order, None] * back)
