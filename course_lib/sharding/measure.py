"""Measure a training step per rank under DDP, ZeRO-1, ZeRO-2 or FSDP: memory, bytes sent, time.

Chapter 3 compares the four strategies of :mod:`course_lib.sharding.strategies` on the same
model; every rank runs :func:`course_lib.sharding.rank_measure.measure_rank` (chapter 1's
tracker on the wrapped model). ``fake=True`` runs the same code on fake tensors and a fake process
group in this process (:mod:`course_lib.sharding.fake`): a 7B model on 8 "GPUs" in seconds.
:func:`memory_vs_world` is chapter 2's question asked with this instrument: per-rank DDP memory
does not shrink with more ranks.
"""
from __future__ import annotations

from typing import Sequence

from torch import nn

from course_lib.common.models import GPTConfig
from course_lib.launcher import devices
from course_lib.launcher.launch import run
from course_lib.memory.report import MemoryReport
from course_lib.sharding.fake import measure_fake
from course_lib.sharding.rank_measure import check_request, make_inputs, measure_rank
from course_lib.sharding.strategies import STRATEGIES

__all__ = ["measure_distributed", "compare_strategies", "memory_vs_world", "measure_rank",
           "check_request", "make_inputs"]


def measure_distributed(model_or_config: nn.Module | GPTConfig | str, batch, *,
                        strategy: str = "ddp", nprocs: int = 2, optimizer: str = "adam",
                        precision: str = "fp32", fake: bool = False, iterations: int = 2,
                        seed: int = 0, timeout: float = 300.0,
                        ranks: Sequence[int] | None = None,
                        recompute: str = "none") -> list[MemoryReport]:
    """Measure a steady-state training step on ``nprocs`` ranks; one report per rank.

    ``model_or_config``: a :class:`GPTConfig` / preset name with ``batch = (batch_size,
    seq_len)`` per rank (every rank builds the GPT with the same ``seed`` and draws its own
    tokens), or an fp32 module with a tensor ``batch = (inputs, targets)`` that every rank uses.
    ``strategy``: ``"ddp"``, ``"zero1"``, ``"zero2"`` or ``"fsdp"``; ``precision``: ``"fp32"``,
    ``"amp"`` or, for ZeRO-2 / FSDP, ``"mixed"`` (FSDP2's bf16 ``MixedPrecisionPolicy``). Real runs go through :func:`course_lib.run`. ``fake=True`` (config only) simulates
    every rank on fake tensors in this process and allocates nothing: for models that do not fit.
    ``ranks`` (fake only) picks which ranks to simulate (each costs one fake run). ``recompute``
    (a GPT only): ``"selective"`` or ``"full"`` activation recomputation, as chapter 1's
    :meth:`GPT.set_recompute` — FSDP + checkpointed blocks is the usual pairing.
    Raises ``ValueError``/``TypeError`` for a bad request before any process starts.
    """
    check_request(model_or_config, batch, strategy, nprocs, optimizer, precision, iterations,
                  recompute)
    kwargs = dict(strategy=strategy, optimizer=optimizer, precision=precision,
                  iterations=iterations, seed=seed, recompute=recompute)
    if fake:
        return measure_fake(model_or_config, batch, nprocs=nprocs, ranks=ranks, **kwargs)
    if ranks is not None:
        raise ValueError("ranks= only applies to fake=True: a real run measures every rank")
    devices.plan(nprocs)  # bad world sizes fail here, with the launcher's message
    return run(measure_rank, nprocs, model_or_config, batch, timeout=timeout, **kwargs)


def _measure_each(model_or_config, batch, strategies: Sequence[str], **kwargs) -> dict:
    return {s: measure_rank(model_or_config, batch, strategy=s, **kwargs) for s in strategies}


def compare_strategies(model_or_config: nn.Module | GPTConfig | str, batch, *,
                       strategies: Sequence[str] = STRATEGIES, nprocs: int = 2,
                       optimizer: str = "adam", precision: str = "fp32", iterations: int = 2,
                       seed: int = 0, timeout: float = 300.0) -> dict[str, list[MemoryReport]]:
    """:func:`measure_distributed` for several strategies in one launch: ``{strategy: reports}``.

    The ranks measure the strategies one after the other (a fresh model each time), which saves
    a launch per strategy. Real runs only.
    """
    strategies = list(strategies)
    if not strategies:
        raise ValueError("strategies must name at least one strategy")
    for strategy in strategies:
        check_request(model_or_config, batch, strategy, nprocs, optimizer, precision, iterations)
    devices.plan(nprocs)
    per_rank = run(_measure_each, nprocs, model_or_config, batch, strategies, timeout=timeout,
                   optimizer=optimizer, precision=precision, iterations=iterations, seed=seed)
    return {s: [ranks[s] for ranks in per_rank] for s in strategies}


def memory_vs_world(preset: str = "small", batch: tuple[int, int] = (4, 32),
                    worlds: Sequence[int] = (1, 2, 4)) -> dict[int, dict[str, int]]:
    """Per-rank bytes (rank 0's report; all ranks agree) of a DDP step at each world size.

    Keys per world: ``params``, ``grads``, ``optimizer``, ``model_states`` and ``peak``, plus
    ``max_rank_model_states`` (the largest over ranks). Each rank runs chapter 3's
    ``measure_rank`` (what ``measure_distributed(strategy="ddp")`` runs), here with one thread
    per rank: the CPU analogue of one GPU each, and no idle threads spinning on a busy machine.
    """
    out = {}
    for world in worlds:
        check_request(preset, batch, "ddp", world, "adam", "fp32")
        reports = run(measure_rank, world, preset, batch, strategy="ddp", threads=1)
        row = {k: reports[0][k] for k in ("params", "grads", "optimizer", "model_states", "peak")}
        row["max_rank_model_states"] = max(r["model_states"] for r in reports)
        row["n_params"] = reports[0].n_params
        out[world] = row
    return out
