"""One rank's instrument: wrap, train, track memory, count collectives, time a step.

:func:`measure_rank` is what every rank of :func:`course_lib.sharding.measure.measure_distributed`
runs (and chapters 7 and 8 reuse): chapter 1's ``tracked_steps`` on the wrapped model, under
``MemTracker`` for DDP and ZeRO-1 (after two warm-up steps, so DDP's buckets exist and count as
gradients) and under FSDP2's ``FSDPMemTracker`` for ZeRO-2 and FSDP (which tells sharded from
unsharded parameters). The report holds the steady state after the optimizer step and, apart,
the moment between forward and backward (``unsharded_params``, ``model_states_fwd``): the paper's
ZeRO-2 keeps full 16-bit parameters all the time, so its ``2Ψ + 14Ψ/N`` matches that moment.
``info`` adds the collectives of the last tracked step and the median step time.
"""
from __future__ import annotations

import copy
import statistics
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.nn.parallel import DistributedDataParallel

from course_lib.common.checks import batch_shape, is_int, positive_int
from course_lib.common.deprecation import renamed
from course_lib.common.models import GPT, RECOMPUTE, GPTConfig, get_config
from course_lib.memory.report import MemoryReport
from course_lib.memory.tracker import GlobalMemTracker, tracked_steps
from course_lib.sharding.comm_counter import CommCounter
from course_lib.sharding.strategies import Wrapped, train_step, validate_strategy, wrap

__all__ = ["measure_rank", "validate_request", "FSDPTracker"]

_MODEL_STATE = ("params", "unsharded_params", "buffers", "grads", "unsharded_grads", "optimizer")


def validate_request(model_or_config: object, batch: object, strategy: str, nprocs: int,
                     optimizer: str, precision: str, iterations: int = 2, recompute: str = "none") -> None:
    """Validate a request with clear messages, before any process starts."""
    validate_strategy(strategy, precision, optimizer)
    if recompute not in RECOMPUTE:
        raise ValueError(f"unknown recompute {recompute!r}; choose one of {RECOMPUTE}")
    if recompute != "none" and not isinstance(model_or_config, (GPT, GPTConfig, str)):
        raise ValueError(f"recompute={recompute!r} needs the course's GPT (or a config)")
    positive_int(nprocs, "nprocs")
    if not is_int(iterations) or iterations < 2:
        raise ValueError("iterations must be an integer >= 2: optimizer states appear in the first step")
    if isinstance(model_or_config, (GPTConfig, str)):
        config = get_config(model_or_config)
        batch_shape(batch, config.seq_len, "per rank")
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


__getattr__ = renamed(__name__, {"check_request": "validate_request"})  # before issue 32


def make_inputs(config: GPTConfig, shape: tuple[int, int], *, seed: int, rank: int,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids ``(inputs, targets)`` for one rank, deterministic in ``(seed, rank)``."""
    on_fake = isinstance(torch.empty(0), FakeTensor)
    gen = None if on_fake else torch.Generator().manual_seed(seed * 1_000_003 + rank)
    tokens = torch.randint(0, config.vocab_size, (shape[0], shape[1] + 1), generator=gen)
    return tokens[:, :-1].clone().to(device), tokens[:, 1:].clone().to(device)


def measure_rank(model_or_config: nn.Module | GPTConfig | str, batch, *, strategy: str = "ddp",
                 optimizer: str = "adam", precision: str = "fp32", iterations: int = 2,
                 seed: int = 0, timed_steps: int = 2, mesh=None, fake: bool = False,
                 recompute: str = "none") -> MemoryReport:
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
    if isinstance(model, GPT):  # before wrapping: FSDP2 then sees each checkpointed block's forward
        model.set_recompute(recompute)
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
                       optimizer=optimizer, fake=fake, batch=tuple(batch[0].shape), recompute=recompute,
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


class FSDPTracker(GlobalMemTracker, FSDPMemTracker):
    """``FSDPMemTracker`` keeping only global peaks (per-module peaks made a fake 7B step ~5x slower;
    the planner of chapter 07 tracks its fake steps with it too)."""


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
        tracker = FSDPTracker(wrapped.model, wrapped.optimizer)
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
