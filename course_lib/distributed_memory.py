"""Measure a training step per rank under DDP, ZeRO-1, ZeRO-2 or FSDP: memory, bytes sent, time.

Chapter 3 (``03_sharding_zero_fsdp``) compares the four strategies of
:mod:`course_lib.strategies` on the same model; chapter 2 (``02_data_parallel``) measures
``"ddp"``. Each rank runs chapter 1's instrument (:func:`course_lib.memory.tracked_steps`):

* DDP and ZeRO-1 under ``MemTracker`` — after two untracked warm-up steps, so that DDP's gradient
  buckets (which *are* the gradients with ``gradient_as_bucket_view=True``) already exist and are
  filed as gradients, not as activations (DDP rebuilds its buckets in the second forward);
* ZeRO-2 and FSDP under FSDP2's ``FSDPMemTracker``, which also tells sharded from unsharded
  parameters.

The report (a :class:`~course_lib.memory_report.MemoryReport`, same keys as ``measure_step``)
holds the **steady state** after the optimizer step (``params``, ``grads``, ``optimizer``,
``model_states``) and, separately, the moment **between forward and backward**:
``unsharded_params`` (full parameters gathered by FSDP and still alive at the end of forward) and
``model_states_fwd`` (everything of the model alive then). ZeRO-2 as FSDP2 builds it
(``reshard_after_forward=False``) holds sharded *and* full parameters from forward to backward and
only the shards after it; the paper's ZeRO-2 keeps the full 16-bit parameters *all the time*: its
``2Ψ + 14Ψ/N`` describes our ``model_states_fwd`` moment, not the steady state.
``info`` adds ``strategy``, ``world_size``, ``rank``, ``comm`` (bytes per collective type, calls,
ZeRO-paper volume, counted by :class:`course_lib.comm_count.CommCounter` in the last tracked
step) and
``step_time_s`` (median of untracked steps).

``fake=True`` runs the same thing on fake tensors and a fake process group in this process (see
:mod:`course_lib.fake_distributed`), so a 7B model on 8 "GPUs" takes seconds and no memory.
"""
from __future__ import annotations

import copy
import statistics
import time
import warnings
from typing import Sequence

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.nn.parallel import DistributedDataParallel

from course_lib import devices
from course_lib.comm_count import CommCounter
from course_lib.launch import run
from course_lib.memory import GlobalMemTracker, tracked_steps
from course_lib.memory_report import MemoryReport
from course_lib.models import GPT, GPTConfig, get_config
from course_lib.strategies import STRATEGIES, Wrapped, train_step, validate_strategy, wrap

__all__ = ["measure_distributed", "compare_strategies", "measure_rank", "check_request",
           "check_fits"]

_MODEL_STATE = ("params", "unsharded_params", "buffers", "grads", "unsharded_grads", "optimizer")


def check_request(model_or_config: object, batch: object, strategy: str, nprocs: int,
                  optimizer: str, precision: str, iterations: int = 2) -> None:
    """Validate a request with clear messages, before any process starts."""
    validate_strategy(strategy, precision, optimizer)
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive integer, got {nprocs!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 2:
        raise ValueError("iterations must be an integer >= 2: optimizer states appear in the first step")
    if isinstance(model_or_config, (GPTConfig, str)):
        config = get_config(model_or_config)
        ok = (isinstance(batch, tuple) and len(batch) == 2
              and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in batch))
        if not ok:
            raise ValueError(f"with a config, batch must be (batch_size, seq_len) per rank, got {batch!r}")
        if batch[1] > config.seq_len:
            raise ValueError(f"seq_len={batch[1]} exceeds the config's seq_len={config.seq_len}")
    elif isinstance(model_or_config, nn.Module):
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2
                and all(isinstance(t, torch.Tensor) for t in batch)):
            raise ValueError("with a module, batch must be a pair of tensors (inputs, targets)")
        wrong = {str(p.dtype) for p in model_or_config.parameters() if p.dtype != torch.float32}
        if wrong:
            raise ValueError(f"the module must hold fp32 parameters (precision='amp' adds bf16 "
                             f"compute itself), found {sorted(wrong)}")
    else:
        raise TypeError("model_or_config must be an nn.Module, a GPTConfig or a preset name, "
                        f"got {type(model_or_config).__name__}")


def check_fits(model_or_config: object, batch, strategies: Sequence[str], nprocs: int,
               optimizer: str, precision: str) -> None:
    """Refuse a real run of a config whose predicted bytes exceed free memory (before any process).

    Per rank: the full fp32 model each rank builds before wrapping, or the strategy's model states
    (:func:`course_lib.zero.per_rank_bytes`), whichever is larger, plus what flows through a step
    (chapter 1's activation formula). All ranks share this machine's RAM; on GPUs, each GPU's free
    memory holds the ranks placed on it. A given module has already allocated: not checked.
    """
    if not isinstance(model_or_config, (GPTConfig, str)):
        return
    from course_lib import zero
    from course_lib.memory import _flow_bytes, format_bytes
    config = get_config(model_or_config)
    shapes = zero.param_shapes(config)
    states = max(max(row["model_states"], row["model_states_fwd"])
                 for s in strategies for row in zero.per_rank_bytes(shapes, s, nprocs, optimizer,
                                                                    precision))
    per_rank = max(states, 4 * sum(zero._numel(shape) for shape in shapes)) + \
        _flow_bytes(config, tuple(batch), precision)
    placement = devices.plan(nprocs)
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


def make_inputs(config: GPTConfig, shape: tuple[int, int], *, seed: int, rank: int,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids ``(inputs, targets)`` for one rank, deterministic in ``(seed, rank)``."""
    on_fake = isinstance(torch.empty(0), FakeTensor)
    gen = None if on_fake else torch.Generator().manual_seed(seed * 1_000_003 + rank)
    tokens = torch.randint(0, config.vocab_size, (shape[0], shape[1] + 1), generator=gen)
    return tokens[:, :-1].clone().to(device), tokens[:, 1:].clone().to(device)


def measure_rank(model_or_config: nn.Module | GPTConfig | str, batch, *, strategy: str = "ddp",
                 optimizer: str = "adam", precision: str = "fp32", iterations: int = 2,
                 seed: int = 0, timed_steps: int = 2, mesh=None, fake: bool = False) -> MemoryReport:
    """What each rank of :func:`measure_distributed` runs (call it inside a rank).

    Builds the GPT from the config with ``seed`` (the same on every rank) or moves the given
    module to this rank's device, wraps it, measures memory, counts one step's collectives and
    times ``timed_steps`` more. ``fake=True`` (with a ``mesh`` built outside ``FakeTensorMode``)
    skips the timing, which would mean nothing on fake tensors.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu") if fake or not torch.cuda.is_available() else \
        torch.device("cuda", torch.cuda.current_device())
    if isinstance(model_or_config, nn.Module):
        # a copy: FSDP turns the module's parameters into shards in place
        model = copy.deepcopy(model_or_config).to(device)
        batch = tuple(t.to(device) for t in batch)
    else:
        config = get_config(model_or_config)
        torch.manual_seed(seed)
        with torch.device(device):
            model = GPT(config)
        batch = make_inputs(config, batch, seed=seed, rank=rank, device=device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
        warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
        wrapped = wrap(model, strategy, optimizer=optimizer, precision=precision, mesh=mesh,
                       foreach=False if fake else None, ddp_hooks=fake)
        comm = CommCounter()
        report = _tracked(wrapped, batch, iterations, comm)
        per_step = _last_step_calls(comm.calls, iterations)
        times = []
        for _ in range(0 if fake else timed_steps):
            dist.barrier()
            start = time.perf_counter()
            train_step(wrapped, batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
    report.info.update(strategy=strategy, world_size=world, rank=rank, precision=precision,
                       optimizer=optimizer, fake=fake, batch=tuple(batch[0].shape),
                       comm=per_step,
                       step_time_s=statistics.median(times) if times else None)
    return report


def _last_step_calls(calls: list, iterations: int) -> dict:
    """Summarise the collectives of the last of ``iterations`` identical tracked steps."""
    counter = CommCounter()
    counter.calls = calls[len(calls) - len(calls) // iterations:]
    if len(calls) % iterations:
        raise RuntimeError(f"the {iterations} tracked steps made {len(calls)} collective calls: "
                           "not the same number each step, so no steady state")
    return {"bytes": counter.bytes_by_type(), "calls": counter.calls_by_type(),
            "volume": counter.volume()}


class _FSDPTracker(GlobalMemTracker, FSDPMemTracker):
    """``FSDPMemTracker`` keeping only global peaks (per-module peaks made a fake 7B step ~5x slower)."""


def _tracked(wrapped: Wrapped, batch, iterations: int, comm: CommCounter) -> MemoryReport:
    """Chapter 1's ``tracked_steps`` with the tracker each strategy needs; adds the fwd figures.

    ``comm`` counts the collectives of the tracked steps (not of DDP's warm-up steps).
    """
    inputs, targets = batch
    if wrapped.strategy in ("ddp", "zero1"):
        # DDP builds its buckets in step 1 and rebuilds them in step 2's forward (the fake
        # stand-in needs one step to hand out its gradient views)
        for _ in range(2 if isinstance(wrapped.model, DistributedDataParallel) else 1):
            train_step(wrapped, batch)
        tracker = GlobalMemTracker()
        tracker.track_external(wrapped.model, wrapped.optimizer, inputs, targets)
    else:
        tracker = _FSDPTracker(wrapped.model, wrapped.optimizer)
        tracker.track_inputs((inputs, targets))
    with comm:  # outside the tracker's mode: counts what the tracked steps send
        report = tracked_steps(wrapped.model, wrapped.optimizer, batch, loss_fn=wrapped.loss_fn,
                               tracker=tracker, iterations=iterations,
                               autocast_dtype=wrapped.autocast_dtype)
    forward = report.timeline[-3][1]
    report.bytes["unsharded_params"] = forward.get("unsharded_params", 0)
    report.bytes["model_states_fwd"] = sum(forward.get(key, 0) for key in _MODEL_STATE)
    local = [p.to_local() if hasattr(p, "to_local") else p for p in wrapped.model.parameters()]
    report.n_params = sum(p.numel() for p in local)  # this rank's share (per_param divides by it)
    report.info["total_params"] = sum(p.numel() for p in wrapped.model.parameters())
    return report


def measure_distributed(model_or_config: nn.Module | GPTConfig | str, batch, *,
                        strategy: str = "ddp", nprocs: int = 2, optimizer: str = "adam",
                        precision: str = "fp32", fake: bool = False, iterations: int = 2,
                        seed: int = 0, timeout: float = 300.0,
                        ranks: Sequence[int] | None = None) -> list[MemoryReport]:
    """Measure a steady-state training step on ``nprocs`` ranks; one report per rank.

    ``model_or_config``: a :class:`GPTConfig` / preset name with ``batch = (batch_size,
    seq_len)`` per rank (every rank builds the GPT with the same ``seed`` and draws its own
    tokens), or an fp32 module with a tensor ``batch = (inputs, targets)`` that every rank uses.
    ``strategy``: ``"ddp"``, ``"zero1"``, ``"zero2"`` or ``"fsdp"``; ``precision``: ``"fp32"`` or
    ``"amp"``. Real runs go through :func:`course_lib.run`. ``fake=True`` (config only) simulates
    every rank on fake tensors in this process and allocates nothing: for models that do not fit.
    ``ranks`` (fake only) picks which ranks to simulate (each costs one fake run).
    Raises ``ValueError``/``TypeError`` for a bad request before any process starts.
    """
    check_request(model_or_config, batch, strategy, nprocs, optimizer, precision, iterations)
    kwargs = dict(strategy=strategy, optimizer=optimizer, precision=precision,
                  iterations=iterations, seed=seed)
    if fake:
        from course_lib.fake_distributed import measure_fake
        return measure_fake(model_or_config, batch, nprocs=nprocs, ranks=ranks, **kwargs)
    if ranks is not None:
        raise ValueError("ranks= only applies to fake=True: a real run measures every rank")
    devices.plan(nprocs)  # bad world sizes fail here, with the launcher's message
    check_fits(model_or_config, batch, [strategy], nprocs, optimizer, precision)
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
    check_fits(model_or_config, batch, strategies, nprocs, optimizer, precision)
    per_rank = run(_measure_each, nprocs, model_or_config, batch, strategies, timeout=timeout,
                   optimizer=optimizer, precision=precision, iterations=iterations, seed=seed)
    return {s: [ranks[s] for ranks in per_rank] for s in strategies}
