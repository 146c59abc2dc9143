"""The small model and data that every strategy script here trains (ddp.py, fsdp.py, ...).

The course GPT's ``"tiny"`` preset (2 blocks, ~0.1 M parameters) on the course corpus, as byte
tokens: the first ``WINDOWS`` non-overlapping windows of the training split, so that a run of
``STEPS`` steps at ``GLOBAL_BATCH`` windows a step crosses an epoch boundary (what
``DistributedSampler.set_epoch`` is for). Every script prints ``step N loss X`` with :func:`log`,
the line ``course_lib.launcher.script_magic`` reads.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from course_lib.capstone.data import Windows, split_corpus
from course_lib.common.models import GPT, PRESETS
from course_lib.launcher.torchrun import exit_without_finalizing
from course_lib.tensor_parallel.layers import qkv_rows

__all__ = ["CONFIG", "GLOBAL_BATCH", "STEPS", "LR", "WINDOWS", "dataset", "model", "batch",
           "device", "alone", "log", "group_heads"]

CONFIG = PRESETS["tiny"]
GLOBAL_BATCH = 16        # windows per optimizer step, summed over the data-parallel ranks
WINDOWS = 4 * GLOBAL_BATCH  # one epoch = 4 steps
STEPS = 8                # two epochs
LR = 1e-2


def dataset() -> Windows:
    """The first ``WINDOWS`` windows of ``CONFIG.seq_len`` bytes of the corpus's training split."""
    train, _ = split_corpus()
    return Windows(train[:WINDOWS * CONFIG.seq_len + 1], CONFIG.seq_len)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch number ``step`` (inputs, targets), the same on every rank: for TP and PP."""
    data = dataset()
    first = (step * GLOBAL_BATCH) % len(data)
    rows = [data[i] for i in range(first, first + GLOBAL_BATCH)]
    return torch.stack([x for x, _ in rows]), torch.stack([y for _, y in rows])


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
    Either way the process then ends without interpreter shutdown once the script is done (exit
    code 0, or 1 after an uncaught exception): on the CPU, gloo's threads abort an ordinary
    shutdown now and then ("terminate called without an active exception", SIGABRT, after every
    line was printed), which torchrun reports as a failed rank (2 of 15 launches in one CI-like run).
    """
    exit_without_finalizing()
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
