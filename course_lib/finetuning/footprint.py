"""Measure a LoRA or QLoRA training step per memory category — real or on fake tensors.

Chapter 7 (``07_before_you_distribute``). Chapter 1's :func:`course_lib.memory.tracker.measure_step`
measures a module we hand it (LoRA or not: it only sees tensors), but its ``fake=True`` path
builds a plain GPT. This module builds the fine-tuning variants the way they are used on GPUs,
directly on fake tensors when ``fake=True`` (so a 7B model costs no memory), and runs chapter 1's
instrument on them (:func:`course_lib.memory.tracker.tracked_steps` under ``MemTracker``):

* ``"full"`` — every weight trainable (fp32 weights, AMP compute: 16 B/param of model states);
* ``"lora"`` — frozen **bf16** base, fp32 adapters, fp32 Adam on the adapters, bf16 autocast;
* ``"qlora"`` — the block linears stored in **NF4** (:class:`course_lib.finetuning.quantize.QuantLinear`,
  filed as buffers by the tracker), the rest of the base in bf16, fp32 adapters, bf16 autocast.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Sequence

import torch
import torch._subclasses.fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode

from course_lib.common.checks import batch_shape
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.common.training import make_optimizer
from course_lib.finetuning.lora import DEFAULT_TARGETS, add_lora
from course_lib.finetuning.quantize import quantize_model
from course_lib.memory.report import MemoryReport
from course_lib.memory.tracker import tracked_steps
from course_lib.sharding.rank_measure import make_inputs

__all__ = ["METHODS", "build_finetune_model", "measure_finetune", "measure_module"]

METHODS = ("full", "lora", "qlora")


def measure_module(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], *,
                   autocast_dtype: torch.dtype | None = None, lr: float = 1e-3) -> MemoryReport:
    """Chapter 1's :func:`~course_lib.memory.tracker.tracked_steps` on a model with frozen parameters.

    Adam sees only the trainable parameters; the frozen base may be stored in another dtype than
    the adapters (bf16 / NF4), which ``measure_step``'s precision check would refuse. Frozen
    parameters are handled by chapter 1's tracker (:class:`course_lib.memory.tracker.GlobalMemTracker`).
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters: nothing to fine-tune")
    fake = isinstance(batch[0], torch._subclasses.fake_tensor.FakeTensor)
    opt = make_optimizer(trainable, "adam", lr=lr, foreach=False if fake else None)
    report = tracked_steps(model, opt, batch, loss_fn=GPT.loss, autocast_dtype=autocast_dtype)
    report.info.update(trainable=sum(p.numel() for p in trainable), fake=fake)
    return report


def build_finetune_model(config: GPTConfig | str, method: str = "lora", *, r: int = 8,
                         alpha: float = 16.0, targets: Sequence[str] = DEFAULT_TARGETS,
                         seed: int = 0, base_dtype: torch.dtype | None = None) -> GPT:
    """A GPT ready for ``method``: full (fp32), LoRA (frozen base + adapters) or QLoRA (NF4 base).

    ``base_dtype`` is the frozen base's dtype (default bf16 for LoRA/QLoRA, fp32 for full); the
    adapters are always fp32. Works inside ``FakeTensorMode``.
    """
    if method not in METHODS:
        raise ValueError(f"unknown fine-tuning method {method!r}; choose one of {METHODS}")
    config = get_config(config)
    torch.manual_seed(seed)
    if method == "full":
        return GPT(config, dtype=base_dtype)
    model = GPT(config, dtype=base_dtype or torch.bfloat16)
    if method == "qlora":
        quantize_model(model, "nf4", targets=targets)
    torch.manual_seed(seed + 1)
    return add_lora(model, r=r, alpha=alpha, targets=targets)


def measure_finetune(config: GPTConfig | str, batch: tuple[int, int], method: str = "lora", *,
                     r: int = 8, alpha: float = 16.0, targets: Sequence[str] = DEFAULT_TARGETS,
                     fake: bool = True, seed: int = 0) -> MemoryReport:
    """One steady-state step of ``method`` with bf16 autocast, measured per category.

    ``batch = (batch_size, seq_len)``; random tokens. ``fake=True`` allocates nothing. The
    report's ``params`` hold the frozen base (bf16) and the adapters; QLoRA's quantized weights
    are ``buffers``; ``info["trainable"]`` counts the trainable parameters.
    """
    config = get_config(config)
    batch_shape(batch, config.seq_len)
    with FakeTensorMode() if fake else nullcontext():
        model = build_finetune_model(config, method, r=r, alpha=alpha, targets=targets, seed=seed)
        inputs = make_inputs(config, batch, seed=seed, rank=0)
        report = measure_module(model, inputs, autocast_dtype=torch.bfloat16)
    report.info.update(method=method, batch=batch, precision="amp", r=r)
    return report
