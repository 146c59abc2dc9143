"""``run_parallel(layout)``: train on ``prod(layout)`` real ranks, compare with one process.

Every layout is run for ``steps`` Adam steps on real ranks (``course_lib.run``), then checked
against the same model trained in this process on the global batch: ``max_abs_diff_vs_single``
is the largest difference of any weight after the steps. Per rank, ``bytes_measured`` counts
the storages of the rank's local parameters, gradients and optimizer states (DTensor shards via
``to_local()``); ``bytes_predicted`` comes from :mod:`course_lib.composition.layouts`.
"""
from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist
from torch import nn

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.common.training import make_optimizer
from course_lib.composition.context import (_qkv, cp_attention_grad_rank, cp_attention_rank,
                                           cp_predicted_bytes)
from course_lib.composition.layout import MOE, Layout
from course_lib.composition.layouts import predict_moe_bytes, predict_pp_bytes
from course_lib.composition.moe import MoE, ep_forward
from course_lib.composition.records import Record
from course_lib.composition.stored import state_bytes
from course_lib.launcher.by_name import ByName
from course_lib.launcher.launch import run

__all__ = ["run_parallel", "ParallelReport", "RankBytes", "train_ep", "single_gpt", "single_moe",
           "TOLERANCE", "GRAD_TOLERANCE"]

#: gradients agree to ~1e-7 (summation order); weights after Adam steps to ~1e-5: where a
#: gradient is as small as Adam's eps (1e-8), m / (sqrt(v) + eps) turns a 1e-8 rounding
#: difference into a sizeable fraction of lr (1e-3). A wrong batch or a missing shard moves
#: weights by ~lr, a gradient averaged wrongly shows in the gradients (Adam hides a scale).
TOLERANCE = 1e-4
GRAD_TOLERANCE = 1e-6
LR = 1e-3


@dataclasses.dataclass
class RankBytes(Record):
    """One rank's model-state (or, for ``cp``, activation) bytes: measured and predicted."""
    rank: int
    bytes_measured: dict
    bytes_predicted: dict


@dataclasses.dataclass
class ParallelReport(Record):
    """What :func:`run_parallel` returns: the largest weight and gradient differences from one
    process, their tolerances, the losses and every rank's bytes; ``ep`` adds the tokens per
    expert and the all_to_all bytes, ``cp`` the one-process bytes."""
    layout: Layout
    world: int
    max_abs_diff_vs_single: float
    max_abs_grad_diff_vs_single: float
    tolerance: float
    grad_tolerance: float
    ranks: list[RankBytes]
    losses: dict | None = None
    what: str = "training steps"
    single_bytes: dict | None = None
    tokens_per_expert: dict | None = None
    tokens_per_expert_single: list | None = None
    all_to_all_bytes: list | None = None

    @property
    def same_as_single(self) -> bool:
        """Weights (or outputs) and gradients within their tolerances of one process."""
        return (self.max_abs_diff_vs_single < self.tolerance
                and self.max_abs_grad_diff_vs_single < self.grad_tolerance)


def quiet_dtensor_notes() -> None:
    """Silence DTensor's note that gathering a 2-D sharded tensor takes two all_gathers."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def _moe_data(step: int, rank: int, tokens: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    return (torch.randn(tokens, MOE["d_model"], generator=gen),
            torch.randn(tokens, MOE["d_model"], generator=gen))


def train_ep(ep: int, steps: int, tokens: int, seed: int = 0) -> dict:
    """Inside a rank: train the MoE with experts split over ``ep`` ranks (gradients: the router's
    all-reduced and averaged, each expert's summed over all ranks' tokens by the backward
    all_to_all, then divided by ``ep``: the global loss is the mean of the ranks' losses)."""
    rank = dist.get_rank()
    torch.manual_seed(seed)
    moe = MoE(**MOE)
    per = MOE["n_experts"] // ep
    mine = range(rank * per, (rank + 1) * per)
    for e in range(MOE["n_experts"]):      # drop the experts other ranks own
        if e not in mine:
            moe.experts[e] = nn.Identity()
    optimizer = make_optimizer(moe.parameters(), "adam", lr=LR)
    losses, log = [], {}
    for step in range(steps):
        x, target = _moe_data(step, rank, tokens, seed)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ep_forward(moe, x, ep, log=log), target)
        loss.backward()
        dist.all_reduce(moe.router.weight.grad)
        for p in moe.parameters():
            p.grad /= ep
        optimizer.step()
        losses.append(loss.item())
    measured = state_bytes(moe, optimizer)
    return {"rank": rank, "losses": losses, "bytes": measured, "log": log,
            "params": {n: p.detach().clone() for n, p in moe.named_parameters()},
            "grads": {n: p.grad.clone() for n, p in moe.named_parameters()}}


def single_moe(ep: int, steps: int, tokens: int, seed: int = 0) -> tuple[dict, list, torch.Tensor]:
    """The same MoE trained in this process on every rank's tokens at once; also returns the
    global tokens per expert of the last step."""
    torch.manual_seed(seed)
    moe = MoE(**MOE)
    optimizer = make_optimizer(moe.parameters(), "adam", lr=LR)
    losses = []
    for step in range(steps):
        x, target = (torch.cat(t) for t in zip(*(_moe_data(step, r, tokens, seed) for r in range(ep))))
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(moe(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        counts = torch.bincount(moe.router(x).topk(MOE["top_k"], dim=-1)[1].flatten(),
                                minlength=MOE["n_experts"])
    return _state(moe), losses, counts


def single_gpt(config, steps: int, batch: tuple[int, int], dp: int, seed: int = 0):
    """The GPT trained in this process on the global batch (``dp`` ranks' batches together)."""
    torch.manual_seed(seed)
    model = GPT(config)
    optimizer = make_optimizer(model.parameters(), "adam", lr=LR)
    losses = []
    for step in range(steps):
        inputs, targets = get_batch(batch[0] * dp, batch[1], seed=seed, step=step)
        optimizer.zero_grad(set_to_none=True)
        loss = GPT.loss(model(inputs % config.vocab_size), targets % config.vocab_size)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return _state(model), losses


def _state(model: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def _max_diff(results: list[dict], single: dict, key: str) -> float:
    return max((r[key][n] - single[key][n]).abs().max().item() for r in results for n in r[key])


# the GPT layouts' rank function, named: this module's importers need no FSDP2 or DTensor
_RANK_2D = ByName("course_lib.composition.ranks", "rank_2d")


def run_parallel(layout: Layout | dict, *, preset: str = "tiny", steps: int = 2,
                 batch: tuple[int, int] | None = None) -> ParallelReport:
    """Run ``layout`` (a :class:`Layout` or a dict such as ``{"dp_shard": 2, "tp": 2}``) on its
    ranks and check it against one process.

    ``batch`` is ``(sequences, seq_len)`` per data-parallel rank for the GPT layouts (default
    ``(2, 32)``; ``{"pp": 2, ...}`` runs a 2-stage pipeline by hand, each stage FSDP-sharded or
    DDP-replicated) or ``(tokens,)`` per rank for ``{"ep": n}`` (default 16). ``{"cp": n}`` runs
    ring attention (forward, and the ring backward) over the preset's heads and sequence,
    ``batch`` sequences (default 2), against SDPA on the full sequence: its diffs are the
    attention output's and dq/dk/dv's, and its bytes are the forward's activation bytes (see
    :mod:`course_lib.composition.context`). Returns a :class:`ParallelReport`.
    """
    config = get_config(preset)
    layout = Layout.parse(layout, config)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    runner = _run_cp if layout.cp > 1 else _run_ep if layout.ep > 1 else _run_gpt
    return runner(config, layout, steps, batch)


def _run_gpt(config, layout: Layout, steps: int, batch: tuple[int, int] | None) -> ParallelReport:
    """The GPT on the layout's ranks against the same GPT in one process on the global batch (a
    rank of its own: an optimizer's step would import torch._dynamo into the kernel, issue 50)."""
    batch = tuple(batch or (2, 32))
    if batch[1] > config.seq_len:
        raise ValueError(f"seq_len {batch[1]} exceeds the preset's {config.seq_len}")
    predicted = [predict_pp_bytes(config, layout, layout.stage_of(r)) for r in range(layout.world)]
    results = run(_RANK_2D, layout.world, config, layout, steps, batch)
    single = run(single_gpt, 1, config, steps, batch, layout.dp_size)[0]
    return _report(layout, results, *single, predicted)


def _report(layout: Layout, results: list[dict], single: dict, losses: list,
            predicted: list[dict], **extra) -> ParallelReport:
    mean = [sum(r["losses"][i] for r in results) / layout.world for i in range(len(losses))]
    return ParallelReport(
        layout, layout.world, _max_diff(results, single, "params"),
        _max_diff(results, single, "grads"), TOLERANCE, GRAD_TOLERANCE,
        [RankBytes(r["rank"], r["bytes"], predicted[r["rank"]]) for r in results],
        losses={"mean over ranks": mean, "single": losses}, **extra)


def _run_ep(config, layout: Layout, steps: int, batch: tuple[int] | None) -> ParallelReport:
    """The MoE layer with its experts over ``ep`` ranks against the whole layer in this process."""
    tokens = (batch or (16,))[0]
    predicted = [predict_moe_bytes(layout.ep)] * layout.world
    results = run(train_ep, layout.world, layout.ep, steps, tokens)
    single, losses, counts = single_moe(layout.ep, steps, tokens)
    return _report(layout, results, single, losses, predicted,
                   tokens_per_expert={e: n for r in results
                                      for e, n in r["log"]["tokens_per_expert"].items()},
                   tokens_per_expert_single=counts.tolist(),
                   all_to_all_bytes=[r["log"]["all_to_all_bytes"] for r in results])


def _run_cp(config, layout: Layout, steps: int, batch: tuple[int] | None) -> ParallelReport:
    """Ring attention on ``cp`` ranks vs SDPA on the full sequence in this process: the output,
    and dq, dk, dv of the ring backward (loss: the output times a seeded weight, summed)."""
    cp, sequences = layout.cp, (batch or (2,))[0]
    shape = (sequences, config.n_head, config.seq_len, config.head_dim)
    results = run(cp_attention_rank, cp, shape)
    grads = run(cp_attention_grad_rank, cp, shape)
    q, k, v = (t.requires_grad_() for t in _qkv(*shape))
    full = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    (full * weight).sum().backward()
    full = full.detach()
    got = torch.cat([r["out"] for r in results], dim=2)
    grad_diff = max((torch.cat([r[name] for r in grads], dim=2) - ref).abs().max().item()
                    for name, ref in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)))
    predicted = cp_predicted_bytes(shape, cp)
    keys = ("activation_bytes", "score_bytes")
    return ParallelReport(
        layout, cp, (got - full).abs().max().item(), grad_diff, 1e-5, 1e-5,
        [RankBytes(r["rank"], {k: r[k] for k in keys}, predicted) for r in results],
        what="attention forward and backward", single_bytes=cp_predicted_bytes(shape, 1))
