"""Activation checkpointing with torch's own API: what full and selective checkpointing keep, and cost.

Chapter 01's cell is the editable copy of :func:`checkpointed_steps`. It wraps every block of the
course GPT with ``checkpoint_wrapper`` (torch's wrapper around non-reentrant
``torch.utils.checkpoint``), either whole (**full**: only the block's input is kept) or with a
policy from ``create_selective_checkpoint_contexts`` (**selective**: the outputs of the matrix
multiplications with weights, ``aten.mm``/``aten.addmm``, are kept; everything else in the block
is recomputed in backward: layer norms, GELU, the attention scores and softmax). It runs inside a
rank (``course_lib.run``): torch's ``MemTracker`` counts what forward keeps for backward, a plain
timer the forward and forward + backward (the fastest of ``repeats``, the modes taken in turns),
and the gradients are compared with the unwrapped model's. Times depend on the machine.
"""
from __future__ import annotations

import time
from functools import partial

from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import create_selective_checkpoint_contexts

from course_lib.common.models import GPT

__all__ = ["checkpointed_steps"]


def checkpointed_steps(config, batch, modes=("none", "selective", "full"), repeats=3):
    """Inside a rank: per mode, the activations forward keeps (bytes), the fastest forward and
    forward + backward (seconds), and the largest gradient difference from the unwrapped model."""
    import torch                               # here, so that a copy defined in a notebook ships to a rank

    keep = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]   # selective: save these outputs

    def build(mode):
        torch.manual_seed(0)                   # the same weights in every mode
        model = GPT(config)
        for i, block in enumerate(model.blocks):
            if mode == "full":
                model.blocks[i] = checkpoint_wrapper(block)
            elif mode == "selective":
                policy = partial(create_selective_checkpoint_contexts, keep)
                model.blocks[i] = checkpoint_wrapper(block, context_fn=policy)
        return model

    b, s = batch
    tokens = torch.randint(0, config.vocab_size, (b, s + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    models = {mode: build(mode) for mode in modes}
    out, grads = {}, {}
    for mode, model in models.items():
        tracker = MemTracker()
        tracker.track_external(model, x, y)
        with tracker:
            loss = GPT.loss(model(x), y)
            kept = tracker.get_tracker_snapshot()   # after forward: what backward will need
            loss.backward()
        activations = sum(nbytes for per_device in kept.values() for category, nbytes in per_device.items()
                          if getattr(category, "value", None) == "Activation")
        grads[mode] = [p.grad.clone() for p in model.parameters()]
        out[mode] = {"activations": activations, "forward_s": float("inf"), "step_s": float("inf")}
        model.zero_grad(set_to_none=True)
    for _ in range(repeats):                   # in turns, so that a busy moment slows every mode alike
        for mode, model in models.items():
            t0 = time.perf_counter()
            loss = GPT.loss(model(x), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            out[mode]["forward_s"] = min(out[mode]["forward_s"], t1 - t0)
            out[mode]["step_s"] = min(out[mode]["step_s"], t2 - t0)
    reference = grads[modes[0]]
    for mode in modes:
        out[mode]["grad_diff"] = max((a - b).abs().max().item() for a, b in zip(grads[mode], reference))
    return out
