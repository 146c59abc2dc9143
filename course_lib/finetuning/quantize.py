"""Store frozen weights in 8 or 4 bits, dequantize them on the fly: the "Q" of QLoRA (chapter 07).

A frozen weight costs only its storage, which can be compressed: **int8 per-channel absmax**
(:func:`absmax_int8`, :func:`dequantize_int8`, typed in a cell: a scale per output row, values
in ``[-127, 127]``) and **4-bit block-wise** (:func:`quantize_4bit`: blocks of 64 values, each
with its fp32 absmax, every value the index of the nearest of 16 codes, ``"nf4"`` as in
Dettmers et al. 2023 or ``"int4"``; two indices per byte, 4.5 bits per weight).
:class:`QuantLinear` is a frozen linear holding such a weight as buffers and dequantizing it
inside a custom autograd function, in forward and again in backward, so no full-precision copy
is saved for backward. The error bounds, the bytes, and why not torchao or bitsandbytes:
docs/modules/finetuning.md (quantize.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.common.checks import is_int

__all__ = ["NF4_CODES", "INT4_CODES", "QuantizedWeight", "absmax_int8", "dequantize_int8",
           "quantize_int8", "quantize_4bit",
           "quantize", "stored_bytes", "formula_bytes", "error_bound", "QuantLinear",
           "quantize_model", "KINDS"]

#: NormalFloat4 code values (QLoRA, Appendix E; bitsandbytes' table).
NF4_CODES = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
             -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
             0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
             0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
#: Symmetric 4-bit integers scaled to [-8/7, 1]; after absmax scaling -8/7 is never the nearest.
INT4_CODES = tuple(k / 7 for k in range(-8, 8))
_CODES = {"nf4": NF4_CODES, "int4": INT4_CODES}
KINDS = ("int8", "nf4", "int4")


@dataclass
class QuantizedWeight:
    """A quantized 2-D weight: ``data`` (int8 values or packed 4-bit indices) and fp32 ``scales``."""

    kind: str
    data: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    block: int = 0

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The full weight again (``shape``, ``dtype``): only approximately the original."""
        if self.kind == "int8":
            return dequantize_int8(self.data, self.scales).to(dtype)
        codes = torch.tensor(_CODES[self.kind], dtype=torch.float32, device=self.data.device)
        high, low = self.data >> 4, self.data & 0x0F   # two indices per byte
        idx = torch.stack([high, low], dim=-1).flatten().long()
        values = codes[idx].view(-1, self.block) * self.scales[:, None]
        return values.flatten()[:math.prod(self.shape)].view(self.shape).to(dtype)


def _check_weight(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError("quantization expects a 2-D floating-point weight (out_features, in_features)")


def absmax_int8(w):
    """Per output row: scale = max|w_row| / 127, q = round(w / scale) in [-127, 127], int8."""
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127   # the row's largest |w| -> 127
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def dequantize_int8(q, scales):
    """Back to fp32: each int8 value times its row's scale (off by at most scale / 2)."""
    return q.to(torch.float32) * scales[:, None]


def quantize_int8(w: torch.Tensor) -> QuantizedWeight:
    """Per-output-channel absmax int8 (:func:`absmax_int8`) as a :class:`QuantizedWeight`."""
    _check_weight(w)
    w = w.detach().float()
    q, scales = absmax_int8(w)
    return QuantizedWeight("int8", q, scales, tuple(w.shape))


def quantize_4bit(w: torch.Tensor, kind: str = "nf4", block: int = 64) -> QuantizedWeight:
    """Block-wise absmax 4-bit (``"nf4"`` or ``"int4"``), two indices packed per byte."""
    _check_weight(w)
    if kind not in _CODES:
        raise ValueError(f"4-bit kind must be one of {tuple(_CODES)}, got {kind!r}")
    if not is_int(block) or block <= 0 or block % 2:
        raise ValueError(f"block must be a positive even integer, got {block!r}")
    flat = w.detach().float().flatten()
    pad = -flat.numel() % block                       # pad the last block with zeros
    blocks = F.pad(flat, (0, pad)).view(-1, block)
    scales = blocks.abs().amax(dim=1).clamp(min=1e-12)
    codes = torch.tensor(_CODES[kind], dtype=torch.float32, device=w.device)
    normed = blocks / scales[:, None]                 # in [-1, 1]
    # nearest code: codes are sorted, so compare with the midpoints between neighbours
    idx = torch.bucketize(normed, (codes[1:] + codes[:-1]) / 2).to(torch.uint8).flatten()
    packed = (idx[0::2] << 4) | idx[1::2]
    return QuantizedWeight(kind, packed, scales, tuple(w.shape), block)


def quantize(w: torch.Tensor, kind: str = "nf4", block: int = 64) -> QuantizedWeight:
    """:func:`quantize_int8` for ``"int8"``, else :func:`quantize_4bit`."""
    if kind not in KINDS:
        raise ValueError(f"unknown quantization {kind!r}; choose one of {KINDS}")
    return quantize_int8(w) if kind == "int8" else quantize_4bit(w, kind, block)


def stored_bytes(q: QuantizedWeight) -> int:
    """Measured: bytes of the tensors actually stored (data + scales storages)."""
    return q.data.untyped_storage().nbytes() + q.scales.untyped_storage().nbytes()


def formula_bytes(shape: Sequence[int], kind: str = "nf4", block: int = 64) -> int:
    """Predicted storage: int8 ``out·in + 4·out``; 4-bit ``ceil(n/block)·(block/2 + 4)``."""
    out_f, in_f = shape
    if kind == "int8":
        return out_f * in_f + 4 * out_f
    n_blocks = -(-out_f * in_f // block)
    return n_blocks * (block // 2 + 4)


def error_bound(q: QuantizedWeight) -> torch.Tensor:
    """Largest possible ``|W - dequantize(q)|`` per element, from the scales (shape of ``W``)."""
    if q.kind == "int8":
        return (q.scales / 2)[:, None].expand(q.shape)
    codes = torch.tensor(_CODES[q.kind], dtype=torch.float32)
    half_gap = ((codes[1:] - codes[:-1]) / 2).max()
    per_block = (q.scales * half_gap)[:, None].expand(-1, q.block)
    return per_block.flatten()[:math.prod(q.shape)].view(q.shape)


class _DequantLinear(torch.autograd.Function):
    """``y = x Wᵀ`` with ``W`` rebuilt from its quantized form in forward *and* in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, module: "QuantLinear") -> torch.Tensor:
        ctx.module, ctx.x_dtype = module, x.dtype
        return F.linear(x, module.dequantize(x.dtype))   # the full weight dies after this line

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        w = ctx.module.dequantize(grad_out.dtype)       # dequantize again instead of saving it
        return (grad_out @ w).to(ctx.x_dtype), None     # frozen: no gradient for the weight


class QuantLinear(nn.Module):
    """A frozen ``nn.Linear`` whose weight is stored quantized (buffers) — the base of QLoRA."""

    def __init__(self, linear: nn.Linear, kind: str = "nf4", block: int = 64) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"QuantLinear wraps an nn.Linear, got {type(linear).__name__}")
        q = quantize(linear.weight, kind, block)
        self.kind, self.block, self.shape = q.kind, q.block, q.shape
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qdata", q.data)
        self.register_buffer("scales", q.scales)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def quantized(self) -> QuantizedWeight:
        return QuantizedWeight(self.kind, self.qdata, self.scales, self.shape, self.block)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.quantized().dequantize(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _DequantLinear.apply(x, self)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def quantize_model(model: nn.Module, kind: str = "nf4", block: int = 64,
                   targets: Sequence[str] = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")) -> nn.Module:
    """Replace the ``targets`` linears of every block of a GPT by :class:`QuantLinear` (in place)."""
    if not hasattr(model, "blocks"):
        raise TypeError(f"quantize_model expects a course GPT (with .blocks), got {type(model).__name__}")
    for block_module in model.blocks:
        for target in targets:
            parent_name, child_name = target.split(".")
            parent = getattr(block_module, parent_name)
            setattr(parent, child_name, QuantLinear(getattr(parent, child_name), kind, block))
    for p in model.parameters():
        p.requires_grad_(False)
    return model
