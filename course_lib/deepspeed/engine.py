"""DeepSpeed ZeRO stages 0-3 as practitioners configure them, run on the course's ranks.

Chapter 08 (``08_deepspeed_and_megatron``) trains the course GPT with a DeepSpeed JSON config —
``{"zero_optimization": {"stage": k}, ...}`` — through ``deepspeed.initialize``, inside ranks
started by :func:`course_lib.run` (or ``course_lib/scripts/train_deepspeed.py`` under torchrun
or the ``deepspeed`` launcher), and checks the result against torch's DDP on the same data.

* :func:`deepspeed_config` — the dict a learner would write as ``ds_config.json``;
* :func:`deepspeed_status` / :func:`load_deepspeed` (in :mod:`course_lib.deepspeed.load`): can
  DeepSpeed run here, and import it inside a rank; if not, chapter 08 falls back to torch's
  ZeroRedundancyOptimizer / FSDP2 (:func:`run_zero_stages`, chapter 3's classes);
* :func:`train_rank_deepspeed` / :func:`run_deepspeed` — every stage in the same ranks (one
  launch), with DDP and chapter 3's torch measurements as references.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Sequence

import torch
import torch.distributed as dist

from course_lib.common.checks import positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.deepspeed.census import census
from course_lib.deepspeed.load import deepspeed_status, load_deepspeed
from course_lib.launcher.launch import run
from course_lib.sharding.formulas import STAGES as TORCH_STAGES
from course_lib.sharding.rank_measure import measure_rank
from course_lib.sharding.strategies import train_rank

__all__ = ["deepspeed_config", "deepspeed_status", "load_deepspeed", "train_rank_deepspeed",
           "run_deepspeed", "train_rank_torch", "run_zero_stages", "STAGES"]

STAGES = (0, 1, 2, 3)


def deepspeed_config(stage: int, *, micro_batch: int = 4, grad_accum: int = 1, lr: float = 1e-3,
                     bucket_elements: int | None = 2**14,
                     persistence_threshold: int | None = 0) -> dict:
    """The DeepSpeed config (``ds_config.json`` as a dict) for ZeRO ``stage`` in fp32.

    ``train_micro_batch_size_per_gpu`` is the per-rank batch, ``gradient_accumulation_steps``
    the micro-batches per step (DeepSpeed derives ``train_batch_size`` = micro × accum × world).
    The optimizer is torch's own Adam (``torch_adam: true``: no compiled fused kernel;
    ``adam_w_mode: false``: plain Adam like chapter 3's, not DeepSpeed's default AdamW).
    No ``fp16``/``bf16`` section: fp32 everywhere, like the torch runs it is compared with.
    ``gradient_clipping: 0``: DeepSpeed clips the gradient norm to 1.0 *by default*, torch does
    not — left on, the third step already differs from DDP by ~5e-5.
    ``bucket_elements`` sets ``reduce_bucket_size`` and ``allgather_bucket_size``: DeepSpeed's
    default, 5e8 elements, is a 2 GB fp32 buffer that ZeRO-3 allocates at initialisation and
    ZeRO-1/2 inside every backward (``None``: keep the default).
    For stage 3, ``stage3_param_persistence_threshold`` (DeepSpeed's default: 100,000 elements)
    keeps tensors smaller than that whole on every rank; every tensor of the tiny course GPT is
    smaller, so the course sets it to 0 to see the sharding a large model gets (``None``: keep
    DeepSpeed's default).
    """
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")
    for name, value in (("micro_batch", micro_batch), ("grad_accum", grad_accum)):
        positive_int(value, f"{name}")
    zero: dict[str, Any] = {"stage": stage}
    if bucket_elements is not None and stage > 0:
        zero["reduce_bucket_size"] = bucket_elements
        zero["allgather_bucket_size"] = bucket_elements
    if stage == 3 and persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = persistence_threshold
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "optimizer": {"type": "Adam",
                      "params": {"lr": lr, "torch_adam": True, "adam_w_mode": False}},
        "zero_optimization": zero,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _full_params(engine: Any, stage: int) -> dict[str, torch.Tensor]:
    """Every parameter as a full CPU tensor; ZeRO-3 gathers its partitions (a collective)."""
    module = engine.module
    if stage == 3:
        import deepspeed
        params = list(module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {n: p.detach().clone() for n, p in module.named_parameters()}
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def train_rank_deepspeed(stages: Sequence[int] = STAGES, config: GPTConfig | str = "tiny", *,
                         steps: int = 3, batch: tuple[int, int] = (4, 32), lr: float = 1e-3,
                         seed: int = 0, reference: bool = True, torch_memory: bool = True,
                         build_comm_op: bool = False) -> dict:
    """Inside a rank: train ``GPT(config)`` ``steps`` steps under each ZeRO stage in ``stages``.

    Returns ``{stage: {"losses", "params", "after_backward", "after_step", "optimizer"}}``, where
    the memory entries are :func:`census` of the last step (after ``engine.backward`` and after
    ``engine.step``). With ``reference``, ``"ddp"`` holds chapter 3's
    :func:`course_lib.sharding.strategies.train_rank` (torch DDP, plain Adam) on the same data; with
    ``torch_memory``, ``"torch"`` holds chapter 3's measurement
    (:func:`course_lib.sharding.rank_measure.measure_rank`) of torch's DDP, ZeroRedundancyOptimizer
    and FSDP2 strategies on the same model and batch shape.
    """
    start = time.perf_counter()
    deepspeed = load_deepspeed(build_comm_op=build_comm_op)
    config = get_config(config)
    rank, world = dist.get_rank(), dist.get_world_size()
    seconds = {"import": time.perf_counter() - start}
    out: dict = {"world_size": world, "rank": rank, "seconds": seconds}
    for stage in stages:
        start = time.perf_counter()
        torch.manual_seed(seed)
        model = GPT(config)
        ds_config = deepspeed_config(stage, micro_batch=batch[0], lr=lr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notes from DeepSpeed's collectives
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=ds_config)
            losses = []
            for step in range(steps):
                inputs, targets = get_batch(*batch, seed=seed, step=step, rank=rank,
                                            world_size=world)
                loss = GPT.loss(engine(inputs % config.vocab_size), targets % config.vocab_size)
                engine.backward(loss)
                after_backward = census(engine)
                engine.step()
                losses.append(float(loss.detach()))
            after_step = census(engine)
            params = _full_params(engine, stage)
        out[stage] = {"losses": losses, "params": params, "after_backward": after_backward,
                      "after_step": after_step, "optimizer": type(engine.optimizer).__name__}
        engine.destroy()
        del engine, model
        seconds[f"stage {stage}"] = time.perf_counter() - start
    start = time.perf_counter()
    if reference:
        out["ddp"] = train_rank(config, "ddp", steps=steps, batch=batch, lr=lr, seed=seed)
    seconds["ddp"] = time.perf_counter() - start
    start = time.perf_counter()
    if torch_memory:
        out["torch"] = _torch_memory(config, batch, seed)
    seconds["torch memory"] = time.perf_counter() - start
    return out


def _torch_memory(config: GPTConfig, batch: tuple[int, int], seed: int,
                  stages: Sequence[int] = STAGES) -> dict:
    """Chapter 3's per-rank measurement of torch's strategy for each stage (no timing)."""
    keys = ("params", "grads", "optimizer", "model_states", "model_states_fwd")
    out = {}
    for name, stage in TORCH_STAGES.items():
        if stage in stages:
            report = measure_rank(config, batch, strategy=name, seed=seed, timed_steps=0)
            out[stage] = {"strategy": name, **{k: report[k] for k in keys}}
    return out


def run_deepspeed(stages: Sequence[int] = STAGES, config: GPTConfig | str = "tiny", *,
                  nprocs: int = 2, steps: int = 3, batch: tuple[int, int] = (4, 32),
                  lr: float = 1e-3, seed: int = 0, reference: bool = True,
                  torch_memory: bool = True, timeout: float = 300.0) -> list[dict]:
    """Launch :func:`train_rank_deepspeed` on ``nprocs`` ranks; one result dict per rank.

    Raises ``RuntimeError`` with :func:`deepspeed_status`'s reason before starting any process
    when DeepSpeed cannot run here, and ``ValueError`` for a bad stage.
    """
    stages = list(stages)
    for stage in stages:
        if stage not in STAGES:
            raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")
    ok, reason = deepspeed_status()
    if not ok:
        raise RuntimeError(reason)
    return run(train_rank_deepspeed, nprocs, stages, config, steps=steps, batch=batch, lr=lr,
               seed=seed, reference=reference, torch_memory=torch_memory, timeout=timeout)


def train_rank_torch(stages: Sequence[int] = STAGES, config: GPTConfig | str = "tiny", *,
                     steps: int = 3, batch: tuple[int, int] = (4, 32), lr: float = 1e-3,
                     seed: int = 0) -> dict:
    """The fallback inside a rank: torch's equivalent of each stage, in the same result shape.

    Stage 0 → DDP, 1 → ZeroRedundancyOptimizer, 2 → FSDP2 without resharding, 3 → FSDP2
    (chapter 3's :mod:`course_lib.sharding.strategies`). ``after_step`` is chapter 3's measurement;
    ``after_backward`` is ``None`` (that moment is DeepSpeed's).
    """
    names = {stage: name for name, stage in TORCH_STAGES.items()}
    memory = _torch_memory(get_config(config), batch, seed, stages)
    out: dict = {"world_size": dist.get_world_size(), "rank": dist.get_rank()}
    for stage in stages:
        trained = train_rank(config, names[stage], steps=steps, batch=batch, lr=lr, seed=seed)
        m = memory[stage]
        after = {"params": m["params"], "grads": m["grads"], "master": 0,
                 "optimizer": m["optimizer"], "buckets": 0, "other": 0,
                 "model_states": m["model_states"]}
        out[stage] = {**trained, "after_backward": None, "after_step": after,
                      "optimizer": names[stage]}
    out["ddp"] = train_rank(config, "ddp", steps=steps, batch=batch, lr=lr, seed=seed)
    out["torch"] = memory
    return out


def run_zero_stages(stages: Sequence[int] = STAGES, config: GPTConfig | str = "tiny", *,
                    nprocs: int = 2, steps: int = 3, batch: tuple[int, int] = (4, 32),
                    timeout: float = 300.0) -> dict:
    """DeepSpeed's ZeRO stages if it can run here, else torch's equivalents (chapter 08's entry).

    Returns ``{"engine": "deepspeed" | "torch", "reason": str, "ranks": [per-rank dicts]}``
    (see :func:`train_rank_deepspeed` / :func:`train_rank_torch` for the per-rank dicts).
    """
    ok, reason = deepspeed_status()
    if ok:
        ranks = run_deepspeed(stages, config, nprocs=nprocs, steps=steps, batch=batch,
                              timeout=timeout)
    else:
        ranks = run(train_rank_torch, nprocs, list(stages), config, steps=steps, batch=batch,
                    timeout=timeout)
    return {"engine": "deepspeed" if ok else "torch", "reason": reason, "ranks": ranks}
