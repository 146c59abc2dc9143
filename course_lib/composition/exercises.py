"""Chapter 09's exercise check: a learner's all_to_all exchange, run on real ranks.

The learner writes ``exchange(rows, send_counts)``: rows are sorted by destination rank,
``send_counts[r]`` of them go to rank r; it returns the rows this rank receives (from rank 0
first). The check runs it on 2 real ranks with random tokens routed by a real MoE router and
compares each rank's result with :func:`course_lib.composition.moe.dispatch`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.composition.layouts import MOE
from course_lib.composition.moe import MoE, dispatch, owner, route
from course_lib.launcher.launch import run

__all__ = ["check_exchange"]


def _compare(exchange, ep: int) -> tuple[bool, str]:
    rank, n_experts = dist.get_rank(), MOE["n_experts"]
    torch.manual_seed(0)
    moe = MoE(**MOE)
    x = torch.randn(12, MOE["d_model"], generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        _, experts = route(moe, x)
        want = dispatch(x, experts, n_experts, ep)[0]
        flat = experts.flatten()
        order = torch.argsort(owner(flat, n_experts, ep), stable=True)
        counts = torch.bincount(owner(flat, n_experts, ep), minlength=ep)
        got = exchange(x.repeat_interleave(experts.size(1), dim=0)[order], counts.clone())
    if not isinstance(got, torch.Tensor):
        return False, f"rank {rank}: exchange returned {type(got).__name__}, not a tensor"
    if got.shape != want.shape:
        return False, (f"rank {rank} received rows of shape {tuple(got.shape)}, expected {tuple(want.shape)}: "
                       "exchange the counts first, then size the output by the counts received "
                       "(output_split_sizes = received, input_split_sizes = send_counts)")
    if not torch.equal(got, want):
        return False, f"rank {rank} received the right number of rows, but not the right ones (order?)"
    return True, f"rank {rank}: {got.size(0)} rows received, each from the right rank, in order"


def check_exchange(exchange, ep: int = 2) -> tuple[bool, str]:
    """For ``check_true``: run ``exchange`` on ``ep`` real ranks; pass if every rank got its rows."""
    results = run(_compare, ep, exchange, ep)
    bad = [m for ok, m in results if not ok]
    return (not bad, bad[0] if bad else f"all {ep} ranks received exactly the rows dispatch sends")
