"""The small model and data that every script here trains (ddp.py, fsdp.py, ...).

The course GPT's ``"tiny"`` preset (2 blocks, ~0.1 M parameters) on the course corpus, as byte
tokens: its first ``WINDOWS`` non-overlapping windows, so that a run of ``STEPS`` steps at
``GLOBAL_BATCH`` windows a step crosses an epoch boundary (what ``DistributedSampler.set_epoch``
is for). Every script prints ``step N loss X`` with :func:`log`, the line the notebooks'
``%%torchrun`` cells read. The scripts import this file as ``tiny`` (it sits beside them); it
needs only ``course_lib.common`` (the model, its pipeline :class:`Stage`, the corpus), so a copy
of this folder runs wherever ``course_lib`` is importable.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from course_lib.common.data import corpus_tokens
from course_lib.common.models import GPT, PRESETS, Stage, qkv_rows

__all__ = ["CONFIG", "GLOBAL_BATCH", "STEPS", "LR", "WINDOWS", "dataset", "model", "batch",
           "device", "alone", "log", "group_heads", "GPT", "Stage"]

CONFIG = PRESETS["tiny"]
GLOBAL_BATCH = 16        # windows per optimizer step, summed over the data-parallel ranks
WINDOWS = 4 * GLOBAL_BATCH  # one epoch = 4 steps
STEPS = 8                # two epochs
LR = 1e-2


def dataset() -> TensorDataset:
    """The first ``WINDOWS`` windows of ``CONFIG.seq_len`` bytes of the corpus: window i's
    inputs and its targets, the same bytes shifted by one."""
    tokens = corpus_tokens()[:WINDOWS * CONFIG.seq_len + 1].long()
    return TensorDataset(tokens[:-1].view(WINDOWS, -1), tokens[1:].view(WINDOWS, -1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch number ``step`` (inputs, targets), the same on every rank: for TP and PP."""
    inputs, targets = dataset().tensors
    first = (step * GLOBAL_BATCH) % WINDOWS
    return inputs[first:first + GLOBAL_BATCH], targets[first:first + GLOBAL_BATCH]


def model(seed: int = 0) -> GPT:
    """The same initial weights in every process that passes the same ``seed``."""
    torch.manual_seed(seed)
    return GPT(CONFIG)


def device() -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` (made the current GPU) when torch sees a GPU,
    else the CPU. ``init_process_group`` then takes NCCL for the one, gloo for the other."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    gpu = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(gpu)
    return gpu


def alone() -> dict:
    """``init_process_group``'s arguments for a plain ``python script.py``: a group of one.

    Under torchrun (``RANK`` is set) none: it reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
    and ``MASTER_PORT`` from the environment. Alone, an in-memory store: no port is opened.
    """
    if "RANK" in os.environ:
        return {}
    return {"store": dist.HashStore(), "rank": 0, "world_size": 1}


def group_heads(gpt: GPT, tp: int) -> GPT:
    """Reorder each ``attn.qkv``'s output rows so that chunk r of ``tp`` holds q, k, v of rank r's
    heads (``ColwiseParallel`` hands rank r the r-th contiguous chunk). The identity for tp = 1."""
    order = torch.cat([qkv_rows(gpt.config, r, tp) for r in range(tp)])
    with torch.no_grad():
        for block in gpt.blocks:
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[order])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[order])
    return gpt


def log(step: int, loss: float) -> None:
    """The one line every script prints per step (rank 0, or the last pipeline stage)."""
    print(f"step {step} loss {loss:.6f}", flush=True)
