"""Chapter 11's task: a student MLP regressing a fixed random teacher's outputs.

Its loss falls steadily, so "loss after N steps" compares the methods. Kept apart from
:mod:`.measure` so that torchft's replicas (:mod:`.replicas`) import only this and torch, not
the measuring tools (chapter 01's tracker costs 1.6 s of imports in every replica's zygote).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from course_lib.common.models import MLP

__all__ = ["SIZES", "BATCH", "LR", "SEED", "task_batch", "eval_loss"]

SIZES = (128, 256, 256, 16)   # 102,928 parameters: 412 kB of fp32 gradients per step
BATCH, LR, SEED = 32, 0.05, 0


def task_batch(step: int, rank: int, sizes: Sequence[int] = SIZES, batch: int = BATCH,
               seed: int = SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``step`` of ``rank``: inputs and a fixed teacher MLP's outputs (same on any rank)."""
    teacher_gen = torch.Generator().manual_seed(10_000 + seed)
    teacher = MLP(sizes)
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=teacher_gen) / p.shape[-1] ** 0.5)
        x = torch.randn(batch, sizes[0], generator=torch.Generator().manual_seed(
            seed + 1 + 7919 * step + 104_729 * rank))
        return x, teacher(x)


def eval_loss(model: torch.nn.Module, sizes: Sequence[int] = SIZES) -> float:
    """Loss on a held-out batch (rank -1: no rank trains on it)."""
    x, y = task_batch(0, -1, sizes, 256)
    with torch.no_grad():
        return F.mse_loss(model(x), y).item()
