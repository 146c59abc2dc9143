"""``train_gpt(layout)``: predict, train on real ranks, measure — the capstone's notebook face.

Before the run, :func:`predict_run` gives each rank's model-state bytes and peak, the FLOPs of
one step (``torch.utils.flop_counter``) and, given this machine's constants (matmul peak, α-β),
the step time. After it, :func:`train_gpt` reports bytes as stored, each rank's peak, step
times beside the prediction, tokens per second and the course's MFU: model FLOPs per second
(matmuls only: the CPU's attention kernel has no counter formula) over a *measured* peak
(``matmul_peak``, one thread's best 512 × 512 fp32 product, times the cores the ranks ran on).
PaLM's MFU (appendix B) counts attention and divides by the theoretical peak: not comparable.
"""
from __future__ import annotations

import functools
import math
import statistics
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from course_lib.capstone.predict import predict_peak, predict_step_time
from course_lib.capstone.train import machine_constants, rank_entry
from course_lib.communication.alphabeta import AlphaBeta
from course_lib.common.checks import positive_int
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.composition.layouts import predict_gpt_bytes, predict_pp_bytes, validate_layout
from course_lib.fault_tolerance.training import Fault
from course_lib.launcher.devices import plan, usable_cores
from course_lib.launcher.launch import run

__all__ = ["LAYOUTS", "validate_run", "dp_size", "step_flops", "measure_constants", "predict_run",
           "train_gpt"]

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
    batch, counted by ``torch.utils.flop_counter``: the matmuls, 6 per weight and token. The
    counter has formulas for the flash, memory-efficient and cuDNN attention kernels but not for
    the CPU's, so on the CPU attention's own products (QKᵀ, AV) are not counted; nor is Adam."""
    torch.manual_seed(0)
    model = GPT(config)
    x = torch.randint(0, config.vocab_size, (batch_size, config.seq_len))
    with FlopCounterMode(display=False) as counter:
        GPT.loss(model(x), x).backward()
    return counter.get_total_flops()


def measure_constants(world: int = 2) -> dict:
    """This machine's ``matmul_peak`` (FLOP/s, one thread) and ``link`` (α, β of an all-reduce
    among ``world`` ranks: chapter 05's fit), measured on real ranks; nothing trains."""
    positive_int(world, "world")
    return run(machine_constants, world, timeout=120, threads=1)[0]


def _step_prediction(config, layout, batch_size, flops, ranks, constants) -> dict:
    """The slowest rank's predicted step (:func:`~course_lib.capstone.predict.predict_step_time`)."""
    link = AlphaBeta(*constants["link"]) if constants.get("link") else None
    times = [predict_step_time(config, layout, batch_size, flops, b, constants["matmul_peak"],
                               link) for b in ranks]
    return max(times, key=lambda t: t["step_s"])


def predict_run(layout: dict, preset: str | GPTConfig = "small", batch_size: int = 8,
                constants: dict | None = None) -> dict:
    """Before any process starts: per rank the predicted model-state bytes (params, grads,
    optimizer, model_states) and peak bytes, and the FLOPs of one step on the global batch;
    with ``constants`` (:func:`measure_constants`) also ``step_predicted`` (seconds)."""
    layout, config = validate_run(layout, preset, 1, batch_size)
    world = math.prod(layout.values()) if layout else 1
    if "pp" in layout:  # stage = the rank's pp coordinate (pp is the outermost mesh dimension)
        per_stage = world // layout["pp"]
        ranks = [predict_pp_bytes(config, layout, r // per_stage) for r in range(world)]
        stages = [r // per_stage for r in range(world)]
    else:
        ranks, stages = [predict_gpt_bytes(config, layout or {"dp": 1})] * world, [None] * world
    peaks = [predict_peak(config, layout, batch_size, b, st) for b, st in zip(ranks, stages)]
    out = {"layout": layout, "world": world, "bytes_predicted": ranks, "peak_predicted": peaks,
           "flops_per_step": step_flops(config, batch_size),
           "tokens_per_step": batch_size * config.seq_len}
    if constants is not None:
        out["step_predicted"] = _step_prediction(config, layout, batch_size,
                                                 out["flops_per_step"], ranks, constants)
    return out


def train_gpt(layout: dict, *, preset: str | GPTConfig = "small", steps: int = 20,
              batch_size: int = 8, lr: float = 3e-3, seed: int = 0,
              ckpt_dir: str | Path | None = None, every: int = 0, eval_every: int = 10,
              faults: tuple[Fault, ...] = (), timeout: float = 300.0,
              device: str | None = None) -> dict:
    """Train the course GPT on ``layout`` (``{}``: one process) on real ranks; report.

    ``batch_size`` is the global batch in sequences of the preset's ``seq_len`` (the same for
    every layout, so their curves can be compared), split over the data-parallel ranks. With
    ``ckpt_dir``, the run resumes from the newest checkpoint there and saves one every ``every``
    steps. Returns ``losses``, ``val_losses`` ([step, loss]), ``tokens_per_s``, ``mfu``,
    ``step_seconds`` (median), ``step_predicted`` (compute, comm and step seconds from the
    constants the ranks measured before their first step: ``matmul_peak``, FLOP/s of one
    thread, and ``link``, α and β) and ``step_ratio`` (measured / predicted), ``flops_per_step``,
    ``cores``, ``params`` (dense) and ``ranks``: per rank ``bytes_measured`` and
    ``bytes_predicted``, ``peak_measured`` (the second step's peak; ``None`` after one step)
    and ``peak_predicted``. ``device``: ``None`` lets ``run`` choose (CUDA + NCCL with a GPU
    per rank, else CPU + gloo), ``"cpu"`` or ``"cuda"``.
    """
    layout, config = validate_run(layout, preset, steps, batch_size, ckpt_dir)
    predicted = predict_run(layout, config, batch_size)
    world = predicted["world"]
    if device is None and "pp" in layout:  # chapter 09's stages send CPU tensors
        device = "cpu"
    placement = plan(world, None, device)  # "cuda" without a GPU fails here, before any process
    if placement.device == "cuda" and "pp" in layout:
        raise ValueError("pipeline layouts run on the CPU here (chapter 09's stages send CPU "
                         "tensors); use device='cpu'")
    kwargs = {"batch_size": batch_size // dp_size(layout), "lr": lr, "seed": seed,
              "eval_every": eval_every, "ckpt_dir": str(ckpt_dir) if ckpt_dir else None,
              "every": every, "faults": tuple(faults), "device": placement.device}
    results = run(rank_entry, world, config, layout, steps, kwargs, timeout=timeout, threads=1,
                  device=placement.device, backend=placement.backend)
    first = results[0]
    step = _step_prediction(config, layout, batch_size, predicted["flops_per_step"],
                            predicted["bytes_predicted"], first)
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
            "link": first["link"], "step_predicted": step,
            "step_ratio": statistics.median(first["step_seconds"]) / step["step_s"] if ran else 0.0,
            "params": params,
            "device": placement.device, "backend": placement.backend,
            "ranks": [{"rank": r["rank"], "stage": r["stage"], "bytes_measured": r["bytes"],
                       "bytes_predicted": predicted["bytes_predicted"][r["rank"]],
                       "peak_measured": r["peak"],
                       "peak_predicted": predicted["peak_predicted"][r["rank"]]}
                      for r in results]}
