"""``train_gpt(layout)``: predict, train on real ranks, measure — the capstone's notebook face.

Before the run, :func:`predict_run` gives each rank's model-state bytes (chapter 09's
:mod:`course_lib.composition.layouts`, built on chapter 03's FSDP formula and chapter 04's
Megatron split) and the FLOPs of one step, counted by ``torch.utils.flop_counter`` on the
dense model and the global batch. After it, :func:`train_gpt` reports what the ranks measured:
each rank's model-state bytes as stored, the step times, tokens per second, and MFU: the model
FLOPs per second achieved over the peak of this CPU (``matmul_peak``, measured by rank 0 on one
thread, times the cores the ranks ran on).
"""
from __future__ import annotations

import functools
import math
import statistics
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from course_lib.capstone.train import rank_entry
from course_lib.common.checks import positive_int
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.composition.layouts import predict_gpt_bytes, predict_pp_bytes, validate_layout
from course_lib.fault_tolerance.training import Fault
from course_lib.launcher.devices import usable_cores
from course_lib.launcher.launch import run

__all__ = ["LAYOUTS", "validate_run", "dp_size", "step_flops", "predict_run", "train_gpt"]

#: the layouts the chapter runs (one process first)
LAYOUTS = ({}, {"dp": 2}, {"dp_shard": 2}, {"tp": 2}, {"pp": 2}, {"dp_shard": 2, "tp": 2})
_DIMS = {"dp", "dp_replicate", "dp_shard", "tp", "pp"}


def dp_size(layout: dict[str, int]) -> int:
    """How many data-parallel coordinates (each reads its own part of the global batch)."""
    return math.prod(layout.get(n, 1) for n in ("dp", "dp_replicate", "dp_shard"))


def validate_run(layout: object, preset: str | GPTConfig, steps: object, batch_size: object,
              ckpt_dir: object = None) -> tuple[dict[str, int], GPTConfig]:
    """The layout and config, or a ``ValueError`` saying what to change (no process started)."""
    config = get_config(preset)
    if layout != {}:
        layout = validate_layout(layout, config)
        if not set(layout) <= _DIMS:
            raise ValueError(f"layout {layout}: train_gpt trains the dense GPT on the dimensions "
                             f"{sorted(_DIMS)}; chapter 09 runs 'ep' and 'cp' on their own")
    positive_int(steps, "steps")
    positive_int(batch_size, "batch_size")
    if batch_size % dp_size(layout):
        raise ValueError(f"batch_size={batch_size} sequences per step must split evenly over the "
                         f"{dp_size(layout)} data-parallel ranks of {layout}")
    if ckpt_dir is not None and "pp" in layout:
        raise ValueError("checkpoints of a pipeline layout are not supported here (each stage "
                         "holds other parameter names); use a data- or tensor-parallel layout")
    return dict(layout), config


@functools.lru_cache(maxsize=16)
def step_flops(config: GPTConfig, batch_size: int) -> int:
    """FLOPs of one training step (forward, loss, backward) of the dense GPT on the global
    batch, counted by ``torch.utils.flop_counter`` (matmuls and attention; Adam is not counted)."""
    torch.manual_seed(0)
    model = GPT(config)
    x = torch.randint(0, config.vocab_size, (batch_size, config.seq_len))
    with FlopCounterMode(display=False) as counter:
        GPT.loss(model(x), x).backward()
    return counter.get_total_flops()


def predict_run(layout: dict, preset: str | GPTConfig = "small", batch_size: int = 8) -> dict:
    """Before any process starts: per rank the predicted model-state bytes (params, grads,
    optimizer, model_states), and the FLOPs of one step on the global batch."""
    layout, config = validate_run(layout, preset, 1, batch_size)
    world = math.prod(layout.values()) if layout else 1
    if "pp" in layout:  # stage = the rank's pp coordinate (pp is the outermost mesh dimension)
        per_stage = world // layout["pp"]
        ranks = [predict_pp_bytes(config, layout, r // per_stage) for r in range(world)]
    else:
        ranks = [predict_gpt_bytes(config, layout or {"dp": 1})] * world
    return {"layout": layout, "world": world, "bytes_predicted": ranks,
            "flops_per_step": step_flops(config, batch_size),
            "tokens_per_step": batch_size * config.seq_len}


def train_gpt(layout: dict, *, preset: str | GPTConfig = "small", steps: int = 20,
              batch_size: int = 8, lr: float = 3e-3, seed: int = 0,
              ckpt_dir: str | Path | None = None, every: int = 0, eval_every: int = 10,
              faults: tuple[Fault, ...] = (), timeout: float = 300.0) -> dict:
    """Train the course GPT on ``layout`` (``{}``: one process) on real ranks; report.

    ``batch_size`` is the global batch in sequences of the preset's ``seq_len`` (the same for
    every layout, so their curves can be compared), split over the data-parallel ranks. With
    ``ckpt_dir``, the run resumes from the newest checkpoint there and saves one every ``every``
    steps. Returns ``losses``, ``val_losses`` ([step, loss]), ``tokens_per_s``, ``mfu``,
    ``step_seconds`` (median), ``flops_per_step``, ``matmul_peak`` (FLOP/s, one thread),
    ``cores``, ``params`` (dense) and ``ranks``: per rank ``bytes_measured`` and
    ``bytes_predicted``.
    """
    layout, config = validate_run(layout, preset, steps, batch_size, ckpt_dir)
    predicted = predict_run(layout, config, batch_size)
    kwargs = {"batch_size": batch_size // dp_size(layout), "lr": lr, "seed": seed,
              "eval_every": eval_every, "ckpt_dir": str(ckpt_dir) if ckpt_dir else None,
              "every": every, "faults": tuple(faults)}
    world = predicted["world"]
    results = run(rank_entry, world, config, layout, steps, kwargs, timeout=timeout, threads=1)
    first = results[0]
    cores = min(world, usable_cores())  # affinity mask and cgroup quota, not the host's count
    ran = len(first["step_seconds"])
    train_s = sum(first["step_seconds"])
    achieved = predicted["flops_per_step"] * ran / train_s if ran else 0.0
    params: dict[str, torch.Tensor] = {}
    for r in results:  # a pipeline's stages each hold part of the names
        for name, t in r["params"].items():
            params.setdefault(name, t)
    return {"layout": layout, "preset": config, "world": world, "steps": steps,
            "losses": first["losses"], "val_losses": first["val_losses"],
            "resumed_from": first["resumed_from"],
            "tokens_per_s": predicted["tokens_per_step"] * ran / train_s if ran else 0.0,
            "step_seconds": statistics.median(first["step_seconds"]) if ran else 0.0,
            "flops_per_step": predicted["flops_per_step"], "matmul_peak": first["matmul_peak"],
            "cores": cores, "mfu": achieved / (first["matmul_peak"] * cores),
            "params": params,
            "ranks": [{"rank": r["rank"], "stage": r["stage"], "bytes_measured": r["bytes"],
                       "bytes_predicted": predicted["bytes_predicted"][r["rank"]]}
                      for r in results]}
