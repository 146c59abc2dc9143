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

import psutil
import torch
from torch import nn

from course_lib.common.deprecation import renamed
from course_lib.common.models import GPTConfig, get_config
from course_lib.launcher import devices
from course_lib.launcher.launch import run
from course_lib.memory.report import MemoryReport, format_bytes
from course_lib.memory.predict import flow_bytes
from course_lib.sharding import formulas as zero
from course_lib.sharding.fake import measure_fake
from course_lib.sharding.rank_measure import validate_request, make_inputs, measure_rank
from course_lib.sharding.formulas import canonical_strategy
from course_lib.sharding.strategies import STRATEGIES

__all__ = ["measure_distributed", "compare_strategies", "memory_vs_world", "measure_rank",
           "validate_request", "make_inputs", "validate_fits"]


def validate_fits(model_or_config: object, batch, strategies: Sequence[str], nprocs: int,
                  optimizer: str, precision: str) -> None:
    """Refuse a real run of a config whose predicted bytes exceed free memory (before any process).

    Per rank: the full fp32 model each rank builds before wrapping, or the strategy's model states
    (:func:`course_lib.sharding.formulas.per_rank_bytes`), whichever is larger, plus what flows
    through a step (chapter 1's activation formula). All ranks share this machine's RAM; on GPUs,
    each GPU's free memory holds the ranks placed on it. A given module has already allocated:
    not checked.
    """
    if not isinstance(model_or_config, (GPTConfig, str)):
        return
    config = get_config(model_or_config)
    shapes = zero.param_shapes(config)
    states = max(max(row["model_states"], row["model_states_fwd"])
                 for s in strategies for row in zero.per_rank_bytes(shapes, s, nprocs, optimizer,
                                                                    precision))
    per_rank = max(states, 4 * sum(zero._numel(shape) for shape in shapes)) + \
        flow_bytes(config, tuple(batch), precision)
    placement = devices.place(nprocs)
    if placement.device == "cuda":
        ranks_per_gpu = -(-nprocs // devices.gpu_count())
        needed, free = ranks_per_gpu * per_rank, min(
            torch.cuda.mem_get_info(i)[0] for i in range(min(nprocs, devices.gpu_count())))
        where = "on a GPU"
    else:
        needed, free, where = nprocs * per_rank, psutil.virtual_memory().available, "of RAM"
    if needed > free:
        raise MemoryError(f"{nprocs} rank(s) of this run need about {format_bytes(needed)} "
                          f"{where} (predicted: {format_bytes(per_rank)} per rank) but only "
                          f"{format_bytes(free)} is free; use fake=True to measure it on fake "
                          "tensors without allocating, or a smaller model, batch or strategy")


__getattr__ = renamed(__name__, {"check_fits": "validate_fits"})  # before issue 32


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
    ``strategy``: ``"ddp"``, ``"zero1"``, ``"fsdp_no_reshard"`` or ``"fsdp"``; ``precision``: ``"fp32"``,
    ``"amp"`` or, for the two FSDP2 strategies, ``"mixed"`` (FSDP2's bf16 ``MixedPrecisionPolicy``). Real runs go through :func:`course_lib.run`. ``fake=True`` (config only) simulates
    every rank on fake tensors in this process and allocates nothing: for models that do not fit.
    ``ranks`` (fake only) picks which ranks to simulate (each costs one fake run). ``recompute``
    (a GPT only): ``"selective"`` or ``"full"`` activation recomputation, as chapter 1's
    :meth:`GPT.set_recompute` — FSDP + checkpointed blocks is the usual pairing.
    Raises ``ValueError``/``TypeError`` for a bad request before any process starts.
    """
    strategy = canonical_strategy(strategy)
    validate_request(model_or_config, batch, strategy, nprocs, optimizer, precision, iterations,
                  recompute)
    kwargs = dict(strategy=strategy, optimizer=optimizer, precision=precision,
                  iterations=iterations, seed=seed, recompute=recompute)
    if fake:
        return measure_fake(model_or_config, batch, nprocs=nprocs, ranks=ranks, **kwargs)
    if ranks is not None:
        raise ValueError("ranks= only applies to fake=True: a real run measures every rank")
    devices.place(nprocs)  # bad world sizes fail here, with the launcher's message
    validate_fits(model_or_config, batch, [strategy], nprocs, optimizer, precision)
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
    strategies = [canonical_strategy(s) for s in strategies]
    if not strategies:
        raise ValueError("strategies must name at least one strategy")
    for strategy in strategies:
        validate_request(model_or_config, batch, strategy, nprocs, optimizer, precision, iterations)
    devices.place(nprocs)
    validate_fits(model_or_config, batch, strategies, nprocs, optimizer, precision)
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
        validate_request(preset, batch, "ddp", world, "adam", "fp32")
        reports = run(measure_rank, world, preset, batch, strategy="ddp", threads=1,
                      timed_steps=0)  # memory only: the two timed steps would be thrown away
        row = {k: reports[0][k] for k in ("params", "grads", "optimizer", "model_states", "peak")}
        row["max_rank_model_states"] = max(r["model_states"] for r in reports)
        row["n_params"] = reports[0].n_params
        out[world] = row
    return out
