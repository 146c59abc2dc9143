"""Bytes per element of every dtype the course's predictors count: one table, read from torch.

``BYTES[torch.float32] == 4`` comes from ``torch.dtype.itemsize``, so a prediction's "4 B per
fp32 weight" is the same number the allocator uses. The names below are what the predictors
write instead of a literal ``4 *``: ``FP32`` for weights, gradients, master copies, Adam's
moments and its fp32 ``step`` counter; ``BF16`` for 16-bit weights and activations (``FP16`` in the ZeRO paper's count); ``INT64``
for token ids and position ids; ``FP64`` for DeepSpeed's grad-norm scalar; ``BOOL`` for masks.
"""
from __future__ import annotations

import torch

__all__ = ["BYTES", "FP32", "BF16", "FP16", "INT64", "FP64", "BOOL", "nbytes"]

BYTES: dict[torch.dtype, int] = {dtype: dtype.itemsize for dtype in (
    torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
    torch.int8, torch.uint8, torch.bool)}
FP32, BF16, FP16 = BYTES[torch.float32], BYTES[torch.bfloat16], BYTES[torch.float16]
INT64, FP64, BOOL = BYTES[torch.int64], BYTES[torch.float64], BYTES[torch.bool]


def nbytes(dtype: torch.dtype) -> int:
    """Bytes of one element of ``dtype``."""
    return BYTES.get(dtype, dtype.itemsize)
