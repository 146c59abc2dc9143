"""LoRA by hand: a frozen base layer plus a trainable low-rank update ``(alpha/r)·B·A``.

Chapter 07. LoRA (Hu et al., 2021) freezes every base weight ``W`` (out × in) and learns, for
chosen linears, ``A`` (r × in) and ``B`` (out × r): ``y = x Wᵀ + b + (alpha / r) · x Aᵀ Bᵀ``.
``B`` starts at zero (training starts from the base model), ``A`` Kaiming-uniform as in the
paper's code. The update equals the dense weight ``W + (alpha/r)·B·A`` (:func:`merge_lora`, the
tests' reference). Only ``A`` and ``B`` get gradients and Adam states; the activations do not
shrink (backward still needs every layer's input). The base can be any module with
``in_features`` / ``out_features``: an ``nn.Linear`` or a quantized
:class:`course_lib.finetuning.quantize.QuantLinear` (QLoRA). Why not ``peft``:
docs/modules/finetuning.md (lora.py).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.common.dtypes import FP32
from course_lib.common.checks import positive_int
from course_lib.common.models import GPTConfig, get_config

__all__ = ["DEFAULT_TARGETS", "LoRALinear", "add_lora", "merge_lora", "lora_layers",
           "trainable_parameters", "lora_param_count", "lora_state_bytes", "merged_reference_check",
           "validate_lora_rank", "validate_targets"]

#: The linears of each block of :class:`course_lib.common.models.GPT` that get adapters by default.
DEFAULT_TARGETS = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
_ALL_TARGETS = DEFAULT_TARGETS


def validate_lora_rank(r: int, alpha: float) -> None:
    """Clear errors for a rank that is not a positive integer or a non-positive alpha."""
    positive_int(r, "LoRA rank r")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ValueError(f"LoRA alpha must be a positive number, got {alpha!r}")


def validate_targets(targets: Sequence[str]) -> tuple[str, ...]:
    """The ``targets`` as a tuple, if they are a non-empty subset of the GPT block's linears."""
    targets = tuple(targets)
    bad = [t for t in targets if t not in _ALL_TARGETS]
    if not targets or bad:
        raise ValueError(f"LoRA targets must be a non-empty subset of {_ALL_TARGETS}, got {targets!r}")
    return targets


class LoRALinear(nn.Module):
    """``base(x) + (alpha/r) · (x Aᵀ) Bᵀ`` with ``base`` frozen and ``A``, ``B`` trainable."""

    def __init__(self, base, r=8, alpha=16.0, dtype=torch.float32):
        super().__init__()
        validate_lora_rank(r, alpha)
        self.base, self.r, self.scale = base, r, alpha / r
        for p in base.parameters():
            p.requires_grad_(False)                   # the base is frozen
        self.A = nn.Parameter(torch.empty(r, base.in_features, dtype=dtype))
        self.B = nn.Parameter(torch.zeros(base.out_features, r, dtype=dtype))  # B·A = 0 at first
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # like nn.Linear's weight init

    @property
    def in_features(self):
        return self.base.in_features

    @property
    def out_features(self):
        return self.base.out_features

    def forward(self, x):
        # x Aᵀ first: an (…, r) tensor, so the update never builds an out × in matrix
        return self.base(x) + self.scale * F.linear(F.linear(x, self.A), self.B)


def merge_lora(layer: LoRALinear) -> torch.Tensor:
    """The dense weight a :class:`LoRALinear` is equivalent to: ``W + (alpha/r)·B·A`` (fp32).

    Merged, the adapter costs nothing at inference (peft's ``merge_and_unload``); the layer
    itself is left unchanged.
    """
    base_w = layer.base.dequantize() if hasattr(layer.base, "dequantize") else layer.base.weight
    return base_w.detach().float() + layer.scale * (layer.B.detach().float()
                                                    @ layer.A.detach().float())


def add_lora(model, r=8, alpha=16.0, targets=DEFAULT_TARGETS):
    """Freeze every parameter of a GPT and wrap the ``targets`` linears of each block (in place).

    Returns the model. Adapters are fp32 whatever the base dtype (as peft does); ``A`` is drawn
    from torch's global generator, so seed it for reproducible runs.
    """
    validate_lora_rank(r, alpha)
    targets = validate_targets(targets)
    if not hasattr(model, "blocks"):
        raise TypeError(f"add_lora expects a course GPT (with .blocks), got {type(model).__name__}")
    for p in model.parameters():
        p.requires_grad_(False)                       # the whole base model is frozen ...
    for block in model.blocks:
        for target in targets:                        # ... the new A and B train
            parent_name, child_name = target.split(".")
            parent = getattr(block, parent_name)
            child = getattr(parent, child_name)
            if isinstance(child, LoRALinear):
                raise ValueError(f"{target} already has a LoRA adapter")
            setattr(parent, child_name, LoRALinear(child, r, alpha))
    return model


def lora_layers(model: nn.Module) -> list[LoRALinear]:
    """Every :class:`LoRALinear` in ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def trainable_parameters(model: nn.Module) -> int:
    """Number of parameters with ``requires_grad`` (what the optimizer updates)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lora_param_count(config: GPTConfig | str, r: int, targets: Sequence[str] = DEFAULT_TARGETS) -> int:
    """Adapter parameters from the sizes alone: ``r·(in + out)`` per wrapped linear per block.

    For width h: qkv r·(h + 3h), attn.proj r·2h, mlp.fc r·5h, mlp.proj r·5h.
    """
    validate_lora_rank(r, 1.0)
    h = get_config(config).d_model
    in_out = {"attn.qkv": (h, 3 * h), "attn.proj": (h, h), "mlp.fc": (h, 4 * h), "mlp.proj": (4 * h, h)}
    per_block = sum(r * sum(in_out[t]) for t in validate_targets(targets))
    return get_config(config).n_layer * per_block


def lora_state_bytes(frozen_weight_bytes: int, n_adapter: int, n_adapter_tensors: int,
                     optimizer_states: int = 2) -> dict[str, int]:
    """Model states of LoRA training with fp32 adapters and fp32 Adam.

    ``params`` = the frozen weights (as stored) + 4 B per adapter parameter; ``grads`` = 4 B per
    adapter parameter only; ``optimizer`` = ``optimizer_states`` × 4 B per adapter parameter + a
    4-byte Adam ``step`` per adapter tensor.
    """
    out = {"params": frozen_weight_bytes + FP32 * n_adapter, "grads": FP32 * n_adapter,
           "optimizer": FP32 * optimizer_states * n_adapter
           + FP32 * n_adapter_tensors * (optimizer_states > 0)}
    return {**out, "model_states": sum(out.values())}


def merged_reference_check(layer: LoRALinear, x: torch.Tensor) -> dict[str, float]:
    """Compare a :class:`LoRALinear` with autograd through its merged dense weight.

    The reference is ``F.linear(x, W + s·B_ref·A_ref, b)`` with ``A_ref``, ``B_ref`` fresh leaf
    copies; both sides back-propagate the same random upstream gradient. Returns the largest
    absolute differences of the output and of the gradients of ``A`` and ``B`` (``A``/``B``'s
    ``.grad`` are left as they were).
    """
    saved = (layer.A.grad, layer.B.grad)
    layer.A.grad = layer.B.grad = None
    gen = torch.Generator().manual_seed(0)
    y = layer(x)
    upstream = torch.randn(y.shape, generator=gen, dtype=y.dtype)
    (y * upstream).sum().backward()
    a_ref = layer.A.detach().clone().requires_grad_(True)
    b_ref = layer.B.detach().clone().requires_grad_(True)
    base_w = layer.base.dequantize() if hasattr(layer.base, "dequantize") else layer.base.weight
    bias = getattr(layer.base, "bias", None)
    y_ref = F.linear(x, base_w.detach() + layer.scale * (b_ref @ a_ref),
                     None if bias is None else bias.detach())
    (y_ref * upstream).sum().backward()
    out = {"forward": (y - y_ref).abs().max().item(),
           "grad_A": (layer.A.grad - a_ref.grad).abs().max().item(),
           "grad_B": (layer.B.grad - b_ref.grad).abs().max().item()}
    layer.A.grad, layer.B.grad = saved
    return out
