"""Chapter 00's whole game: the course GPT trained by one process and by two ranks with torch's
DDP, on the same global batches, so the two loss curves coincide.

:func:`train_gpt_ddp` is typed in chapter 00's cell (this is its tested copy). It is written the
way a training script is written at work (nanoGPT's ``train.py`` adds DDP in the same lines):
join the process group where a launcher started several ranks, wrap the model in ``DDP``, give
each rank its own share of every global batch, and report the whole batch's mean loss. Run in
the notebook's own process it trains alone; under :func:`course_lib.run` (which has joined the
group already) or ``torchrun`` every rank runs it. The capstone (chapter 12) trains the same
model on every layout.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config

__all__ = ["train_gpt_ddp", "LIVE", "LONG_RUN_PATH", "stored_long_run", "stored_record"]

#: the stored longer run (``python benchmarks/whole_game.py long-run`` writes it)
LONG_RUN_PATH = Path(__file__).resolve().parents[2] / "data" / "whole_game_long_run.json"

#: the settings chapter 00 trains with (the function's defaults), for scripts and tests
LIVE = {"steps": 200, "global_batch": 16, "lr": 3e-3, "seed": 0, "preset": "tiny"}


def train_gpt_ddp(steps=200, global_batch=16, lr=3e-3, seed=0, preset="tiny"):
    """Train the course GPT for ``steps`` AdamW steps on global batches of ``global_batch``
    sequences; on several ranks with DDP, each rank reading its share. Returns the loss per
    step (the global batch's mean, the same on every rank) and the trained weights."""
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")          # under torchrun (course_lib.run has done it)
    ddp = dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    if global_batch % world:
        raise ValueError(f"global_batch={global_batch} must split evenly over {world} ranks")
    config = get_config(preset)
    torch.manual_seed(seed)                      # the same initial weights on every rank
    model = GPT(config)
    if ddp:
        model = DDP(model)                       # averages the gradients during backward
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = get_batch(global_batch // world, config.seq_len, seed=seed, step=step,
                         rank=rank, world_size=world)   # this rank's rows of global batch `step`
        loss = GPT.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss = loss.detach()
        if ddp:                                  # the whole batch's loss: the mean over ranks
            dist.all_reduce(loss)
            loss /= world
        losses.append(loss.item())
    weights = getattr(model, "module", model).state_dict()
    return {"losses": losses, "params": weights}


def stored_long_run(path: Path | str = LONG_RUN_PATH) -> dict:
    """The stored longer run of :func:`train_gpt_ddp`: its settings, date, machine, losses every
    50 steps and the samples before and after (JSON written by ``benchmarks/whole_game.py``)."""
    return json.loads(Path(path).read_text())


def stored_record(name: str) -> dict:
    """A stored run of chapter 12 (``data/NAME.json``: ``capstone_long_run``, written by
    ``benchmarks/capstone_long_run.py``; ``capstone_compile``, by ``benchmarks/capstone_compile.py``)."""
    if name not in ("capstone_long_run", "capstone_compile"):
        raise ValueError(f"no stored run {name!r}: capstone_long_run or capstone_compile")
    return json.loads((LONG_RUN_PATH.parent / f"{name}.json").read_text())
