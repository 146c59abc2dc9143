"""Chapter 6's training loop: an FSDP2 GPT that checkpoints, resumes, and fails on purpose.

:func:`train` runs unchanged inside :func:`course_lib.run` (cells, tests) and in
``course_lib/fault_tolerance/train_ft.py`` under ``torchrun --max-restarts``. It builds the course GPT
from a seed, shards each block and the root with ``fully_shard``, trains with Adam on
:func:`course_lib.common.data.get_batch` batches (a pure function of ``(seed, step, rank)``, so
the data position is just the step), resumes from the newest checkpoint in ``ckpt_dir`` that
loads (:func:`course_lib.fault_tolerance.checkpoint.resume_latest` logs why one is skipped),
saves every ``every`` steps, and injects its :class:`Fault` s: ``kill`` (SIGKILL before a step),
``raise`` (an exception before a step) or ``save`` (SIGKILL after writing its shards of
checkpoint ``step``, before the commit marker). A fault fires only in its restart ``attempt``
(``TORCHELASTIC_RESTART_COUNT`` under torchrun), so the resumed run does not die again.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from course_lib.common.checks import non_negative_int, positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig, get_config, param_count
from course_lib.fault_tolerance.checkpoint import load_checkpoint, resume_latest, save_checkpoint
from course_lib.fault_tolerance.faults import (FAULT_KINDS, FAULTS_ENV, Fault, fire, format_faults,
                                              parse_faults)
from course_lib.launcher import progress
from course_lib.launcher.launch import run

__all__ = ["Fault", "parse_faults", "format_faults", "build", "train", "FAULT_KINDS", "FAULTS_ENV",
           "checkpoint_cost", "checkpoint_cost_sweep", "format_cost", "fire"]


def build(config: GPTConfig | str = "tiny", *, seed: int = 0, lr: float = 1e-3
          ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The GPT (same initial weights on every rank), FSDP2-sharded per block, and its Adam."""
    torch.manual_seed(seed)
    model = GPT(get_config(config))
    if dist.is_initialized():
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def _has_losses(manifest: dict) -> None:
    """A checkpoint ``train`` can resume from carries one mean loss per step done."""
    losses = manifest["meta"].get("losses")
    if not (type(losses) is list and len(losses) == manifest["step"]
            and all(type(x) in (int, float) for x in losses)):
        raise ValueError(f"meta has no loss history of {manifest['step']} numbers")


def _check(steps: int, every: int, faults: Sequence[Fault], world: int) -> None:
    positive_int(steps, "steps")
    non_negative_int(every, "every (0: no checkpoints)")
    for f in faults:
        if f.rank >= world or f.step >= steps + (f.kind == "save"):
            raise ValueError(f"{f} is outside this run ({world} ranks, {steps} steps)")
        if f.kind == "save" and (not every or f.step % every or f.step == 0):
            raise ValueError(f"{f}: no checkpoint is saved at step {f.step} (every={every})")


def train(config: GPTConfig | str = "tiny", steps: int = 8, *, ckpt_dir: str | Path | None = None,
          every: int = 2, seed: int = 0, batch_size: int = 2, lr: float = 1e-3,
          faults: Sequence[Fault] = (), attempt: int | None = None, keep: int | None = 2,
          threads: int = 1) -> dict:
    """Train (resuming from ``ckpt_dir`` if it holds a checkpoint); return what happened.

    Returns ``{"losses": [...] (one per step, mean over ranks), "params": {name: tensor} (full
    parameters on rank 0, ``{}`` elsewhere), "resumed_from": step or None, "attempt": n,
    "rng": "restored" | "reseeded" | None}`` (``"reseeded"``: resumed on another world size).
    ``threads`` is fixed (1 by default) so runs under ``run`` and under torchrun do the same
    floating-point work and can be compared bit for bit.
    """
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if attempt is None:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    _check(steps, every, faults, world)
    mine = {(f.step, f.kind): f for f in faults if f.attempt == attempt and f.rank == rank}
    torch.set_num_threads(threads)
    cfg = get_config(config)
    model, optimizer = build(cfg, seed=seed, lr=lr)
    start, losses, resumed, rng = 0, [], None, None
    state = resume_latest(ckpt_dir, model, optimizer, check_meta=_has_losses) \
        if ckpt_dir and every else None  # the newest that loads; each skipped one is logged
    if state is not None:
        start = resumed = state["step"]
        losses, rng = list(state["meta"]["losses"]), state["rng"]
    for step in range(start, steps):
        for kind in ("kill", "raise"):
            if (step, kind) in mine:
                fire(mine[step, kind])
        x, y = get_batch(batch_size, cfg.seq_len, seed=seed, step=step, rank=rank,
                         world_size=world)
        loss = GPT.loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(mean)
        losses.append((mean / world).item())
        done = step + 1
        if rank == 0:
            progress.report(done, steps)  # the notebook's live line (nothing elsewhere)
        if ckpt_dir and every and done % every == 0:
            hook = mine.get((done, "save"))
            save_checkpoint(ckpt_dir, done, model, optimizer, meta={"losses": losses, "seed": seed},
                            keep=keep, before_commit=(lambda f=hook: fire(f)) if hook else None)
    params = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                  cpu_offload=True))
    return {"losses": losses, "params": params, "resumed_from": resumed, "attempt": attempt,
            "rng": rng}


def checkpoint_cost(config: GPTConfig | str, root: str | Path, repeats: int = 3) -> dict:
    """Rank function: seconds to save and to load one checkpoint of ``config`` (best of
    ``repeats``: the run least disturbed by other processes), and its bytes on disk.

    The bytes are what landed on disk (file sizes summed), the seconds what a wall clock saw
    around :func:`save_checkpoint` / :func:`load_checkpoint` (checksums included).
    """
    model, optimizer = build(config)  # get_state_dict creates Adam's moments (zeros): full size
    saves, loads, nbytes = [], [], 0
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        path = save_checkpoint(root, i + 1, model, optimizer, keep=1)
        saves.append(time.perf_counter() - t0)
        nbytes = sum(p.stat().st_size for p in path.iterdir())
        dist.barrier()
        t0 = time.perf_counter()
        load_checkpoint(path, model, optimizer)
        loads.append(time.perf_counter() - t0)
    return {"params": param_count(get_config(config)), "bytes": nbytes, "save_s": min(saves),
            "load_s": min(loads)}


def checkpoint_cost_sweep(configs: Sequence[GPTConfig | str], root: str | Path, *,
                          nprocs: int = 2, repeats: int = 2) -> list[dict]:
    """:func:`checkpoint_cost` for each config on ``nprocs`` ranks (one launch for all); rows as
    rank 0 measured."""
    roots = [Path(root) / f"model{i}" for i in range(len(configs))]
    measured = run(_costs, nprocs, list(configs), roots, repeats)[0]
    return [{"model": config if isinstance(config, str) else f"{config.n_layer}x{config.d_model}",
             **row} for config, row in zip(configs, measured)]


def _costs(configs: Sequence[GPTConfig | str], roots: Sequence[Path], repeats: int) -> list[dict]:
    return [checkpoint_cost(config, where, repeats) for config, where in zip(configs, roots)]


def format_cost(rows: Sequence[dict]) -> str:
    """The sweep as a table: parameters, MB on disk, save and load milliseconds, MB/s."""
    lines = [f"{'model':>8} {'params':>11} {'MB':>8} {'save ms':>8} {'load ms':>8} {'save MB/s':>9}"]
    for r in rows:
        mb = r["bytes"] / 1e6
        lines.append(f"{r['model']:>8} {r['params']:>11,} {mb:8.2f} {r['save_s'] * 1e3:8.1f} "
                     f"{r['load_s'] * 1e3:8.1f} {mb / r['save_s']:9.0f}")
    return "\n".join(lines)
