"""What chapter 08's ranks run; importing this module imports DeepSpeed (once per kernel).

:func:`course_lib.run` forks every rank from a warm server that imports the module of the
function it ships by reference before forking (:mod:`course_lib.launcher._warm`). The rank
functions of the chapter live here, and this module imports DeepSpeed at the top (when it is
installed): the server pays that import once, and every later launch of the chapter — the
bf16 census, each exercise check — starts with DeepSpeed already loaded instead of importing it
again in each rank (seconds per process on 2 cores). The engine module stays free of it.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.deepspeed.holdings import holdings
from course_lib.deepspeed.config import STAGES, deepspeed_config
from course_lib.deepspeed.load import load_deepspeed
from course_lib.deepspeed.loop import train_deepspeed
from course_lib.sharding.formulas import STAGES as TORCH_STAGES
from course_lib.sharding.rank_measure import measure_rank
from course_lib.sharding.strategies import train_rank_sharded

try:
    load_deepspeed()
except Exception:  # noqa: BLE001 - not installed: the engine module's fallback handles it
    pass

__all__ = ["train_rank_deepspeed", "measure_torch", "config_census"]


def _full_params(engine: Any, stage: int) -> dict[str, torch.Tensor]:
    """Every parameter as a full CPU tensor; ZeRO-3 gathers its partitions (a collective)."""
    import deepspeed
    module = engine.module
    with (deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
          if stage == 3 else contextlib.nullcontext()):
        return {n: p.detach().clone() for n, p in module.named_parameters()}


def _batches(config: GPTConfig, batch: tuple[int, int], steps: int, seed: int) -> list:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for step in range(steps):
        inputs, targets = get_batch(*batch, seed=seed, step=step, rank=rank, world_size=world)
        out.append((inputs % config.vocab_size, targets % config.vocab_size))
    return out


def train_rank_deepspeed(stages: Sequence[int] = STAGES, config: GPTConfig | str = "tiny", *,
                         steps: int = 3, batch: tuple[int, int] = (4, 32), lr: float = 1e-3,
                         seed: int = 0, reference: bool = True, torch_memory: bool = True,
                         build_comm_op: bool = False, train: Callable | None = None,
                         make_config: Callable[[int], dict] | None = None) -> dict:
    """Inside a rank: train ``GPT(config)`` ``steps`` steps under each ZeRO stage in ``stages``.

    ``train(model, ds_config, batches, after_backward)`` is the loop (default
    :func:`course_lib.deepspeed.loop.train_deepspeed`; chapter 08 passes its cell's copy) and
    ``make_config(stage)`` the config (default :func:`deepspeed_config` with ``batch[0]`` and
    ``lr``). Returns ``{stage: {"losses", "params", "after_backward", "after_step",
    "optimizer"}}``, the memory entries being :func:`holdings` of the last step. With
    ``reference``, ``"ddp"`` holds chapter 3's torch DDP (plain Adam) on the same data; with
    ``torch_memory``, ``"torch"`` holds chapter 3's measurement of torch's DDP,
    ZeroRedundancyOptimizer and FSDP2 on the same model and batch shape.
    """
    start = time.perf_counter()
    load_deepspeed(build_comm_op=build_comm_op)
    config = get_config(config)
    train = train or train_deepspeed
    make_config = make_config or (lambda k: deepspeed_config(k, micro_batch=batch[0], lr=lr))
    seconds = {"import": time.perf_counter() - start}
    out: dict = {"world_size": dist.get_world_size(), "rank": dist.get_rank(), "seconds": seconds}
    for stage in stages:
        start = time.perf_counter()
        torch.manual_seed(seed)
        model = GPT(config)
        seen: list = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notes from DeepSpeed's collectives
            engine, losses = train(model, make_config(stage), _batches(config, batch, steps, seed),
                                   lambda e: seen.append(holdings(e)))
            params = _full_params(engine, stage)
        out[stage] = {"losses": losses, "params": params, "after_backward": seen[-1],
                      "after_step": holdings(engine), "optimizer": type(engine.optimizer).__name__,
                      "dtype": str(next(engine.module.parameters()).dtype)}
        engine.destroy()
        del engine, model
        seconds[f"stage {stage}"] = time.perf_counter() - start
    start = time.perf_counter()
    if reference:
        out["ddp"] = train_rank_sharded(config, "ddp", steps=steps, batch=batch, lr=lr, seed=seed)
    seconds["ddp"] = time.perf_counter() - start
    start = time.perf_counter()
    if torch_memory:
        out["torch"] = measure_torch(config, batch, seed)
    seconds["torch memory"] = time.perf_counter() - start
    return out


def measure_torch(config: GPTConfig, batch: tuple[int, int], seed: int,
                 stages: Sequence[int] = STAGES) -> dict:
    """Chapter 3's per-rank measurement of torch's strategy for each stage (no timing)."""
    keys = ("params", "grads", "optimizer", "model_states", "model_states_fwd")
    out = {}
    for name, stage in TORCH_STAGES.items():
        if stage in stages:
            report = measure_rank(config, batch, strategy=name, seed=seed, timed_steps=0)
            out[stage] = {"strategy": name, **{k: report[k] for k in keys}}
    return out


def config_census(ds_config: dict, config: GPTConfig | str = "tiny", micro_batches: int = 4,
                  seq_len: int = 32, seed: int = 0) -> dict:
    """Inside a rank: a learner's config through ``deepspeed.initialize`` and ``micro_batches``.

    Returns the engine's batch settings, its weights' dtype, and :func:`holdings` after the
    backward of the second-to-last micro-batch (``"accumulate"``), the last one
    (``"backward"``) and its step (``"step"``) — or ``{"error": ...}`` when DeepSpeed refuses
    the config (the same on every rank: it fails before any collective).
    """
    deepspeed = load_deepspeed()
    config = get_config(config)
    torch.manual_seed(seed)
    model = GPT(config)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine, _, _, _ = deepspeed.initialize(model=model,
                                                   model_parameters=model.parameters(),
                                                   config=ds_config)
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's own refusal, shown to the learner
        return {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"}
    micro = engine.train_micro_batch_size_per_gpu()
    out: dict = {"micro": micro, "accum": engine.gradient_accumulation_steps(),
                 "train_batch": engine.train_batch_size(), "stage": engine.zero_optimization_stage(),
                 "dtype": str(next(engine.module.parameters()).dtype)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, (inputs, targets) in enumerate(_batches(config, (micro, seq_len), micro_batches,
                                                       seed)):
            engine.backward(GPT.loss(engine(inputs), targets))
            if i >= micro_batches - 2:
                out["accumulate" if i == micro_batches - 2 else "backward"] = holdings(engine)
            engine.step()
    out["step"] = holdings(engine)
    engine.destroy()
    return out
