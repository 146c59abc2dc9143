"""DeepSpeed ZeRO stages 0-3 as practitioners configure them, run on the course's ranks (ch. 08).

The course GPT trains from a DeepSpeed config (``{"zero_optimization": {"stage": k}, ...}``)
through ``deepspeed.initialize`` inside ranks of :func:`course_lib.run` (or
``course_lib/deepspeed/train_deepspeed.py`` under torchrun or ``deepspeed``), checked against
torch's DDP on the same data. :func:`deepspeed_config` is the learner's ``ds_config.json``;
:func:`deepspeed_status` / :func:`load_deepspeed` say whether DeepSpeed runs here (if not,
:func:`run_zero_stages` uses chapter 3's torch classes); :func:`train_rank_deepspeed` /
:func:`run_deepspeed` run every stage in one launch with DDP and chapter 3's measurements as
references. Each stage's loop is :func:`course_lib.deepspeed.loop.train_deepspeed` or the
learner's copy (``train=``); :mod:`course_lib.deepspeed.ranks` is the one module that imports
DeepSpeed at its top.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch.distributed as dist

from course_lib.common.models import GPTConfig, get_config
from course_lib.deepspeed.config import STAGES, deepspeed_config
from course_lib.deepspeed.load import deepspeed_status, load_deepspeed
from course_lib.launcher.launch import run
from course_lib.sharding.formulas import STAGES as TORCH_STAGES
from course_lib.sharding.strategies import train_rank_sharded

__all__ = ["deepspeed_config", "deepspeed_status", "load_deepspeed", "train_rank_deepspeed",
           "run_deepspeed", "train_rank_torch", "run_zero_stages", "STAGES"]


def train_rank_deepspeed(*args: Any, **kwargs: Any) -> dict:
    """Inside a rank: :func:`course_lib.deepspeed.ranks.train_rank_deepspeed` (same arguments)."""
    from course_lib.deepspeed.ranks import train_rank_deepspeed as ds_rank  # loads DeepSpeed
    return ds_rank(*args, **kwargs)


def run_deepspeed(stages: Sequence[int] = STAGES, config: GPTConfig | str = "tiny", *,
                  nprocs: int = 2, steps: int = 3, batch: tuple[int, int] = (4, 32),
                  lr: float = 1e-3, seed: int = 0, reference: bool = True,
                  torch_memory: bool = True, timeout: float = 300.0,
                  train: Callable | None = None,
                  make_config: Callable[[int], dict] | None = None) -> list[dict]:
    """Launch :func:`train_rank_deepspeed` on ``nprocs`` ranks; one result dict per rank.

    ``train`` (the training loop) and ``make_config`` (stage → config dict) are shipped to the
    ranks by value when they are defined in a notebook cell: a learner's edit runs there.
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
    from course_lib.deepspeed import ranks  # DeepSpeed is imported here already (status)
    return run(ranks.train_rank_deepspeed, nprocs, stages, config, steps=steps, batch=batch,
               lr=lr, seed=seed, reference=reference, torch_memory=torch_memory,
               timeout=timeout, train=train, make_config=make_config)


def train_rank_torch(stages: Sequence[int] = STAGES, config: GPTConfig | str = "tiny", *,
                     steps: int = 3, batch: tuple[int, int] = (4, 32), lr: float = 1e-3,
                     seed: int = 0) -> dict:
    """The fallback inside a rank: torch's equivalent of each stage, in the same result shape.

    Stage 0 → DDP, 1 → ZeroRedundancyOptimizer, 2 → FSDP2 without resharding, 3 → FSDP2
    (chapter 3's :mod:`course_lib.sharding.strategies`). ``after_step`` is chapter 3's measurement;
    ``after_backward`` is ``None`` (that moment is DeepSpeed's).
    """
    names = {stage: name for name, stage in TORCH_STAGES.items()}
    from course_lib.deepspeed.ranks import measure_torch  # without DeepSpeed: torch only
    memory = measure_torch(get_config(config), batch, seed, stages)
    out: dict = {"world_size": dist.get_world_size(), "rank": dist.get_rank()}
    for stage in stages:
        trained = train_rank_sharded(config, names[stage], steps=steps, batch=batch, lr=lr, seed=seed)
        m = memory[stage]
        after = {"params": m["params"], "grads": m["grads"], "master": 0,
                 "optimizer": m["optimizer"], "buckets": 0, "other": 0,
                 "model_states": m["model_states"]}
        out[stage] = {**trained, "after_backward": None, "after_step": after,
                      "optimizer": names[stage]}
    out["ddp"] = train_rank_sharded(config, "ddp", steps=steps, batch=batch, lr=lr, seed=seed)
    out["torch"] = memory
    return out


def run_zero_stages(stages: Sequence[int] = STAGES, config: GPTConfig | str = "tiny", *,
                    nprocs: int = 2, steps: int = 3, batch: tuple[int, int] = (4, 32),
                    timeout: float = 300.0, train: Callable | None = None,
                    make_config: Callable[[int], dict] | None = None) -> dict:
    """DeepSpeed's ZeRO stages if it can run here, else torch's equivalents (chapter 08's entry).

    Returns ``{"engine": "deepspeed" | "torch", "reason": str, "ranks": [per-rank dicts]}``
    (see :func:`train_rank_deepspeed` / :func:`train_rank_torch` for the per-rank dicts).
    ``train`` and ``make_config`` go to :func:`run_deepspeed` (the torch fallback has neither).
    """
    ok, reason = deepspeed_status()
    if ok:
        ranks = run_deepspeed(stages, config, nprocs=nprocs, steps=steps, batch=batch,
                              timeout=timeout, train=train, make_config=make_config)
    else:
        ranks = run(train_rank_torch, nprocs, list(stages), config, steps=steps, batch=batch,
                    timeout=timeout)
    return {"engine": "deepspeed" if ok else "torch", "reason": reason, "ranks": ranks}
