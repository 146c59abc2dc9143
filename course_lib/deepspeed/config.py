"""The DeepSpeed config of chapter 08: ZeRO ``stage``, batch, optimizer, precision, as a dict.

:func:`deepspeed_config` writes what a learner would save as ``ds_config.json``; the engine
(:mod:`course_lib.deepspeed.engine`), the ranks (:mod:`course_lib.deepspeed.ranks`) and the
exercise checks start from it.
"""
from __future__ import annotations

from typing import Any

from course_lib.common.checks import positive_int

__all__ = ["deepspeed_config", "STAGES"]

STAGES = (0, 1, 2, 3)


def deepspeed_config(stage: int, *, micro_batch: int = 4, grad_accum: int = 1, lr: float = 1e-3,
                     bucket_elements: int | None = 2**14,
                     persistence_threshold: int | None = 0, bf16: bool = False) -> dict:
    """The DeepSpeed config (``ds_config.json`` as a dict) for ZeRO ``stage``, fp32 or bf16.

    ``train_micro_batch_size_per_gpu`` is the per-rank batch, ``gradient_accumulation_steps``
    the micro-batches per step (DeepSpeed derives ``train_batch_size`` = micro × accum × world).
    The optimizer is torch's own Adam (``torch_adam: true``: no compiled fused kernel;
    ``adam_w_mode: false``: plain Adam like chapter 3's, not DeepSpeed's default AdamW).
    No ``fp16``/``bf16`` section by default: fp32 everywhere, like the torch runs it is compared
    with; ``bf16=True`` adds ``"bf16": {"enabled": true}`` (bf16 weights and gradients, fp32
    master weights and Adam states: the mixed precision of the ZeRO paper).
    ``gradient_clipping: 0``: DeepSpeed clips the gradient norm to 1.0 *by default*, torch does
    not — left on, the third step already differs from DDP by ~5e-5.
    ``bucket_elements`` sets ``reduce_bucket_size`` and ``allgather_bucket_size``: DeepSpeed's
    default, 5e8 elements, is a 2 GB fp32 buffer that ZeRO-3 allocates at initialisation and
    ZeRO-1/2 inside every backward (``None``: keep the default).
    For stage 3, ``stage3_param_persistence_threshold`` (DeepSpeed's default: 100,000 elements)
    keeps tensors smaller than that whole on every rank; every tensor of the tiny course GPT is
    smaller, so the course sets it to 0 to see the sharding a large model gets (``None``: keep
    DeepSpeed's default).
    """
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")
    for name, value in (("micro_batch", micro_batch), ("grad_accum", grad_accum)):
        positive_int(value, f"{name}")
    zero: dict[str, Any] = {"stage": stage}
    if bucket_elements is not None and stage > 0:
        zero["reduce_bucket_size"] = bucket_elements
        zero["allgather_bucket_size"] = bucket_elements
    if stage == 3 and persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = persistence_threshold
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "optimizer": {"type": "Adam",
                      "params": {"lr": lr, "torch_adam": True, "adam_w_mode": False}},
        "zero_optimization": zero,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if bf16:
        config["bf16"] = {"enabled": True}
    return config
