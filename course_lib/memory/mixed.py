"""Mixed-precision Adam: bf16 weights and gradients, fp32 master weights and fp32 moments.

The layout of Micikevicius et al. (2018) and of the ZeRO paper's "K = 12": bf16 weights and
gradients (2 + 2 B per parameter), an fp32 master copy (4 B) and Adam's two fp32 moments
(4 + 4 B), 16 B per parameter. Each step upcasts one gradient at a time, runs torch's own Adam
math (``torch.optim.adam.adam``) on the master copy and copies the result into the bf16 weight,
so small updates accumulate in fp32 instead of vanishing in bf16's 8 significant bits.
``fp32_grads=True`` adds an fp32 gradient accumulator per parameter (4 B more: the Ultra-Scale
Playbook's 20 B/param, as nanotron does); each backward adds the bf16 gradient into it, the
step reads and zeroes it. It is kept in :attr:`grad_buffers`, not in the optimizer state, so
memory trackers count it as gradients.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.adam import adam as adam_math

__all__ = ["MixedPrecisionAdam", "MIXED_OPTIMIZERS"]

MIXED_OPTIMIZERS = ("adam", "adamw")


class MixedPrecisionAdam(torch.optim.Optimizer):
    """Adam or AdamW over fp32 master copies of 16-bit parameters.

    ``state[p]`` holds ``master`` (fp32 copy of ``p``), ``exp_avg``, ``exp_avg_sq`` (fp32) and
    ``step`` (a 4-byte fp32 counter, as ``torch.optim.Adam``); moments appear at the first step.
    ``decoupled=True`` is AdamW (default weight decay 0.01, as ``torch.optim.AdamW``).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float | None = None, decoupled: bool = False,
                 fp32_grads: bool = False) -> None:
        params = list(params)
        if any(p.dtype not in (torch.bfloat16, torch.float16) for p in params):
            raise ValueError("MixedPrecisionAdam needs bf16 or fp16 parameters (the fp32 copy is "
                             "its own); call model.to(torch.bfloat16) first")
        if weight_decay is None:
            weight_decay = 0.01 if decoupled else 0.0
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.decoupled, self.fp32_grads = decoupled, fp32_grads
        self.grad_buffers: list[torch.Tensor] = []
        self._hooks = []
        for p in params:
            self.state[p]["master"] = p.detach().float()
            if fp32_grads:
                buffer = torch.zeros_like(p, dtype=torch.float32)
                self.grad_buffers.append(buffer)
                # a tensor hook sees each backward's own gradient (before autograd adds it to
                # p.grad), so micro-batches accumulate in fp32, not in bf16
                self._hooks.append(p.register_hook(_accumulate_into(buffer)))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        """One Adam step per parameter on its fp32 master copy, then copy back to 16 bits."""
        loss = closure() if closure is not None else None
        buffers = iter(self.grad_buffers)
        for group in self.param_groups:
            for p in group["params"]:
                buffer = next(buffers) if self.fp32_grads else None
                if p.grad is None:
                    continue
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(state["master"])
                    state["exp_avg_sq"] = torch.zeros_like(state["master"])
                grad = buffer if buffer is not None else p.grad.float()
                adam_math([state["master"]], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [],
                          [state["step"]], foreach=False, decoupled_weight_decay=self.decoupled,
                          amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1],
                          lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                          maximize=False)
                del grad
                p.copy_(state["master"])
                if buffer is not None:
                    buffer.zero_()
        return loss


def _accumulate_into(buffer: torch.Tensor):
    """A gradient hook that adds each incoming 16-bit gradient into an fp32 buffer (in place)."""
    def hook(grad: torch.Tensor) -> None:
        buffer.add_(grad)
    return hook
