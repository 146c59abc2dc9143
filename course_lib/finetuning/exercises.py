"""Checks for the exercises of chapter 7 (``07_before_you_distribute``).

Each check computes its expected value from the course's own functions (never printed) and
returns a :class:`course_lib.exercises.Feedback`; ``tests/finetuning/test_planner.py`` calls them with a
wrong answer and with the solution.
"""
from __future__ import annotations

import math

from course_lib.common.models import get_config, param_count
from course_lib.exercises import Feedback, check_choice, check_number
from course_lib.finetuning.lora import lora_param_count
from course_lib.sharding.formulas import paper_bytes

__all__ = ["check_lora_params", "check_13b_zero2", "check_capstone"]


def check_lora_params(answer: object) -> Feedback:
    """Trainable LoRA parameters, r = 8, adapters on ``attn.qkv`` and ``mlp.fc`` of ``"small"``."""
    return check_number(answer, lora_param_count("small", 8, ("attn.qkv", "mlp.fc")),
                        name="LoRA parameters", hint="r·(in + out) per wrapped linear, per layer")


def check_13b_zero2(answer: object) -> Feedback:
    """Do a 13B model's model states fit on 8 × 40 GB with ZeRO-2 (paper's 2Ψ + 14Ψ/N, 16-bit)?"""
    fits = paper_bytes(13e9, 8)["zero2"] <= 40e9
    return check_choice(answer, "yes" if fits else "no", ["yes", "no"], name="13B on 8 × 40 GB",
                        hint="ZeRO-2 keeps the full 16-bit parameters on every GPU")


def check_capstone(answer: object) -> Feedback:
    """Fewest 24 GB GPUs for full fine-tuning gpt-7b with FSDP: 16 B/param sharded ideally, 4 GB
    per GPU kept for activations and temporaries."""
    need = math.ceil(16 * param_count(get_config("gpt-7b")) / (24e9 - 4e9))
    return check_number(answer, need, name="capstone: GPUs", unit="GPUs",
                        hint="model states / (GPU memory − headroom), rounded up")
