"""The one optimizer registry and the default loss every chapter trains with.

``OPTIMIZERS`` names what the course supports; ``STATES_PER_PARAM`` says how many state tensors
per parameter each keeps (Adam: exp_avg and exp_avg_sq; SGD with momentum: one buffer) — the
formulas of chapters 1, 3 and 8 and the measured runs both read it from here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.common.models import GPT

__all__ = ["OPTIMIZERS", "STATES_PER_PARAM", "OPTIMIZER_CLASSES", "validate_optimizer",
           "make_optimizer", "default_loss"]

OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")
STATES_PER_PARAM = {"adam": 2, "adamw": 2, "sgd": 0, "sgd-momentum": 1}
#: name -> (torch optimizer class, extra keyword arguments)
OPTIMIZER_CLASSES = {"adam": (torch.optim.Adam, {}), "adamw": (torch.optim.AdamW, {}),
                     "sgd": (torch.optim.SGD, {}),
                     "sgd-momentum": (torch.optim.SGD, {"momentum": 0.9})}


def validate_optimizer(name: object) -> None:
    """Raise a clear ``ValueError`` for an optimizer name the course does not know."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")


def make_optimizer(params, name: str = "adam", *, lr: float = 1e-3,
                   foreach: bool | None = None) -> torch.optim.Optimizer:
    """``"adam"``, ``"adamw"``, ``"sgd"`` or ``"sgd-momentum"`` (momentum 0.9) over ``params``.

    Pass ``foreach=False`` under fake tensors: torch's multi-tensor kernels report a bogus
    optimizer peak there.
    """
    validate_optimizer(name)
    cls, extra = OPTIMIZER_CLASSES[name]
    return cls(params, lr=lr, foreach=foreach, **extra)


def default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer targets (next-token loss for ``(b, s, vocab)`` logits), else MSE."""
    if target.is_floating_point():
        return F.mse_loss(output, target.to(output.dtype))
    if output.dim() == 3:
        return GPT.loss(output, target)
    return F.cross_entropy(output.float(), target)
