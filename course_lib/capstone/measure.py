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

import dataclasses
import functools
import statistics
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from course_lib.common.checks import positive_int
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.composition.layout import DENSE, MAX_RANKS, Layout
from course_lib.composition.predict import rank_prediction, slowest
from course_lib.composition.records import Record
from course_lib.fault_tolerance.faults import Fault
from course_lib.launcher.devices import place, usable_cores
from course_lib.launcher.by_name import ByName
from course_lib.launcher.launch import run

__all__ = ["LAYOUTS", "validate_run", "dp_size", "step_flops", "count_step_flops",
           "measure_constants", "predict_run", "train_gpt", "RunPrediction", "TrainReport",
           "RankRun"]

# The ranks' functions, named: the notebook's process never imports the training loop (FSDP2,
# DTensor, DCP; launcher/by_name.py)
_RANK_ENTRY = ByName("course_lib.capstone.train", "rank_entry")
_MACHINE_CONSTANTS = ByName("course_lib.capstone.train", "machine_constants")

#: the layouts the chapter runs (one process first)
LAYOUTS = ({}, {"dp": 2}, {"dp_shard": 2}, {"tp": 2}, {"pp": 2}, {"dp_shard": 2, "tp": 2})


@dataclasses.dataclass
class RunPrediction(Record):
    """What :func:`predict_run` says before any process starts: per rank the model-state bytes
    (``params``, ``grads``, ``optimizer``, ``model_states``) and the peak; one step's FLOPs."""
    layout: Layout
    config: GPTConfig
    world: int
    bytes_predicted: list[dict]
    peak_predicted: list[int]
    flops_per_step: int
    tokens_per_step: int
    step_predicted: dict | None = None
    rank_work: list[tuple] | None = None  # per rank: FLOPs, bubble stretch, collectives


@dataclasses.dataclass
class RankRun(Record):
    """One rank of a :func:`train_gpt` run: its stage, bytes and peak, measured and predicted."""
    rank: int
    stage: int | None
    bytes_measured: dict
    bytes_predicted: dict
    peak_measured: int | None
    peak_predicted: int


@dataclasses.dataclass
class TrainReport(Record):
    """What :func:`train_gpt` returns (see its docstring for each field)."""
    layout: Layout
    preset: GPTConfig
    world: int
    steps: int
    losses: list[float]
    val_losses: list
    resumed_from: int | None
    tokens_per_s: float
    step_seconds: float
    flops_per_step: int
    matmul_peak: float
    cores: int
    mfu: float
    link: tuple | None
    step_predicted: dict
    step_ratio: float
    params: dict
    device: str
    backend: str
    ranks: list[RankRun]


def dp_size(layout: Layout | dict) -> int:
    """How many data-parallel coordinates (each reads its own part of the global batch)."""
    return Layout.parse(layout, ranks=None).dp_size


def validate_run(layout: object, preset: str | GPTConfig, steps: object, batch_size: object,
                 ckpt_dir: object = None) -> tuple[Layout, GPTConfig]:
    """The layout and config, or a ``ValueError`` saying what to change (no process started)."""
    config = get_config(preset)
    layout = Layout.parse(layout, config, ranks=(1, MAX_RANKS), dims=DENSE)
    positive_int(steps, "steps")
    positive_int(batch_size, "batch_size")
    if batch_size % layout.dp_size:
        raise ValueError(f"batch_size={batch_size} sequences per step must split evenly over the "
                         f"{layout.dp_size} data-parallel ranks of {layout}")
    if ckpt_dir is not None and layout.pp > 1:
        raise ValueError("checkpoints of a pipeline layout are not supported here (each stage "
                         "holds other parameter names); use a data- or tensor-parallel layout")
    return layout, config
@functools.lru_cache(maxsize=16)
def step_flops(config: GPTConfig, batch_size: int) -> int:
    """FLOPs of one training step (forward, loss, backward) of the dense GPT on the global
    batch, counted by ``torch.utils.flop_counter``: the matmuls, 6 per weight and token. The
    counter has formulas for the flash, memory-efficient and cuDNN attention kernels but not for
    the CPU's, so on the CPU attention's own products (QKᵀ, AV) are not counted; nor is Adam.
    Counted in one rank of :func:`run` (the counter imports ``torch._dynamo``, which the ranks'
    server holds already and a notebook's kernel need not), once per config and batch."""
    return run(count_step_flops, 1, config, batch_size, threads=1)[0]


def count_step_flops(config: GPTConfig, batch_size: int) -> int:
    """:func:`step_flops`, counted in this process."""
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
    return run(_MACHINE_CONSTANTS, world, timeout=120, threads=1)[0]


def predict_run(layout: Layout | dict, preset: str | GPTConfig = "small", batch_size: int = 8,
                constants: dict | None = None, *, steps: int = 1,
                ckpt_dir: str | Path | None = None) -> RunPrediction:
    """Before any process starts: per rank the predicted model-state bytes (params, grads,
    optimizer, model_states) and peak bytes, and the FLOPs of one step on the global batch;
    with ``constants`` (:func:`measure_constants`) also ``step_predicted`` (seconds).
    ``steps`` and ``ckpt_dir`` are checked as :func:`train_gpt` would take them."""
    layout, config = validate_run(layout, preset, steps, batch_size, ckpt_dir)
    flops = step_flops(config, batch_size)
    rows = [rank_prediction(config, layout, batch_size, r, flops) for r in range(layout.world)]
    states, peaks, work = (list(column) for column in zip(*rows))
    out = RunPrediction(layout, config, layout.world, states, peaks, flops,
                        batch_size * config.seq_len, rank_work=work)
    if constants is not None:
        out.step_predicted = slowest(work, constants)
    return out


def train_gpt(layout: Layout | dict, *, preset: str | GPTConfig = "small", steps: int = 20,
              batch_size: int = 8, lr: float = 3e-3, seed: int = 0,
              ckpt_dir: str | Path | None = None, every: int = 0, eval_every: int = 10,
              faults: tuple[Fault, ...] = (), timeout: float = 300.0,
              device: str | None = None, trace: str | Path | None = None) -> TrainReport:
    """Train the course GPT on ``layout`` (``{}``: one process) on real ranks; report.

    ``batch_size`` is the global batch in sequences of the preset's ``seq_len`` (the same for
    every layout, so their curves can be compared), split over the data-parallel ranks. With
    ``ckpt_dir``, the run resumes from the newest checkpoint there and saves one every ``every``
    steps. Returns a :class:`TrainReport`: ``losses``, ``val_losses`` ([step, loss]),
    ``tokens_per_s``, ``mfu``, ``step_seconds`` (median), ``step_predicted`` (compute, comm
    and step seconds from the constants the ranks measured before their first step: ``matmul_peak``, FLOP/s of one
    thread, and ``link``, α and β) and ``step_ratio`` (measured / predicted), ``flops_per_step``,
    ``cores``, ``params`` (dense) and ``ranks``: per rank ``bytes_measured`` and
    ``bytes_predicted``, ``peak_measured`` (the second step's peak; ``None`` after one step)
    and ``peak_predicted``. ``device``: ``None`` lets ``run`` choose (CUDA + NCCL with a GPU
    per rank, else CPU + gloo), ``"cpu"`` or ``"cuda"``. ``trace``: a file name; rank 0 writes
    a ``torch.profiler`` trace of its third step there (:mod:`course_lib.capstone.trace` reads it).
    """
    predicted = predict_run(layout, preset, batch_size, steps=steps, ckpt_dir=ckpt_dir)
    layout, config = predicted.layout, predicted.config
    placement = place(layout.world, None, device, pipeline=layout.pp > 1)  # fails here, before any
    kwargs = {"batch_size": batch_size // layout.dp_size, "lr": lr, "seed": seed,
              "eval_every": eval_every, "ckpt_dir": str(ckpt_dir) if ckpt_dir else None,
              "every": every, "faults": tuple(faults), "device": placement.device,
              "trace": str(trace) if trace else None}
    results = run(_RANK_ENTRY, layout.world, config, layout, steps, kwargs, predicted.rank_work,
                  timeout=timeout, threads=1, device=placement.device, backend=placement.backend)
    first = results[0]
    step = first["step_predicted"]
    cores = min(layout.world, usable_cores())  # affinity mask and cgroup quota, not the host's
    ran = len(first["step_seconds"])
    train_s = sum(first["step_seconds"])
    achieved = predicted.flops_per_step * ran / train_s if ran else 0.0
    params: dict[str, torch.Tensor] = {}
    for r in results:  # a pipeline's stages each hold part of the names
        for name, t in r["params"].items():
            params.setdefault(name, t)
    median = statistics.median(first["step_seconds"]) if ran else 0.0
    return TrainReport(
        layout, config, layout.world, steps, first["losses"], first["val_losses"],
        first["resumed_from"],
        tokens_per_s=predicted.tokens_per_step * ran / train_s if ran else 0.0,
        step_seconds=median, flops_per_step=predicted.flops_per_step,
        matmul_peak=first["matmul_peak"], cores=cores,
        mfu=achieved / (first["matmul_peak"] * cores), link=first["link"], step_predicted=step,
        step_ratio=median / step["step_s"] if ran else 0.0, params=params,
        device=placement.device, backend=placement.backend,
        ranks=[RankRun(r["rank"], r["stage"], r["bytes"], predicted.bytes_predicted[r["rank"]],
                       r["peak"], predicted.peak_predicted[r["rank"]]) for r in results])
