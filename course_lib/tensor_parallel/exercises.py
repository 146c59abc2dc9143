"""Chapter 4's tensor-parallel MLP on real ranks: the notebook's own copy, and the learner's f and g.

:func:`compare_tp_mlp` runs a tensor-parallel MLP class (the notebook cell's ``TPMLP``, shipped by
value, so an edit in the cell changes what the ranks run) against the dense MLP and against
torch's DTensor ``ColwiseParallel``/``RowwiseParallel``. :func:`check_f_and_g` runs a learner's
``f(x, group)`` and ``g(x, group)`` inside the same split and says what is off (for
``course_lib.check_true``): the expected values always come from the dense MLP.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.common.models import FeedForward
from course_lib.exercises import Feedback, check_number
from course_lib.launcher.launch import run
from course_lib.tensor_parallel.layers import _slice_linear
from course_lib.tensor_parallel.layers import expected_block_bytes
from course_lib.tensor_parallel.megatron import megatron_layout
from course_lib.tensor_parallel.measure import TP_CONFIG

__all__ = ["OUT_TOL", "GRAD_TOL", "compare_tp_mlp", "check_f_and_g", "check_block_bytes",
           "check_pipeline_micro_batches"]

#: fp32 sums over the hidden units split across ranks and re-added: ~5e-7 on outputs, ~3e-9 on grads.
OUT_TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-4, atol=1e-7)


def _close(a, b, tol: dict) -> bool:
    try:
        torch.testing.assert_close(a, b, **tol)
    except (AssertionError, TypeError, ValueError):
        return False
    return True


def _dense(seed: int):
    """The dense MLP, an input and a random weighting of the output (loss = sum(y * w)), run."""
    torch.manual_seed(seed)
    dense = FeedForward(TP_CONFIG)
    x = torch.randn(2, TP_CONFIG.seq_len, TP_CONFIG.d_model)
    w = torch.randn_like(x)
    xd = x.clone().requires_grad_()
    y = dense(xd)
    (y * w).sum().backward()
    return dense, x, w, y.detach(), xd.grad


def _slices(dense, rank: int, t: int) -> dict[str, torch.Tensor]:
    """The slices of the dense gradients rank ``rank`` should hold (fc rows, proj columns)."""
    width = 4 * TP_CONFIG.d_model // t
    part = slice(rank * width, (rank + 1) * width)
    return {"fc.weight": dense.fc.weight.grad[part], "fc.bias": dense.fc.bias.grad[part],
            "proj.weight": dense.proj.weight.grad[:, part]}


def _mlp_rank(mlp_cls, seed: int) -> dict:
    """On each rank: ``mlp_cls``'s shard vs the dense MLP, and DTensor's split vs ``mlp_cls``'s."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    rank, t = dist.get_rank(), dist.get_world_size()
    dense, x, w, y_dense, xgrad_dense = _dense(seed)
    mlp = mlp_cls(dense, TP_CONFIG, rank, t)
    xs = x.clone().requires_grad_()
    y = mlp(xs)
    (y * w).sum().backward()
    mine = {"fc.weight": mlp.fc.weight.grad, "fc.bias": mlp.fc.bias.grad,
            "proj.weight": mlp.proj.weight.grad}
    mesh = init_device_mesh("cpu", (t,))
    tp = parallelize_module(copy.deepcopy(dense), mesh,
                            {"fc": ColwiseParallel(), "proj": RowwiseParallel()})
    y_torch = tp(x.clone())
    y_torch = y_torch.wait() if hasattr(y_torch, "wait") else y_torch  # AsyncCollectiveTensor
    return {"output": _close(y, y_dense, OUT_TOL),
            "input_grad": _close(xs.grad, xgrad_dense, GRAD_TOL),
            "weight_grads": _close(mine, _slices(dense, rank, t), GRAD_TOL),
            "dtensor": _close(y.detach(), y_torch.detach(), OUT_TOL)}


def compare_tp_mlp(mlp_cls: type, t: int = 2, seed: int = 0) -> list[dict]:
    """Run ``mlp_cls(dense, config, rank, t)`` on ``t`` real ranks; one dict of verdicts per rank.

    ``output``/``input_grad``/``weight_grads``: equal to the dense MLP (its output, the
    gradient of its input, the slices of its weight gradients) within ``OUT_TOL``/``GRAD_TOL``;
    ``dtensor``: the output equals torch's ``parallelize_module`` with ``ColwiseParallel`` on
    ``fc`` and ``RowwiseParallel`` on ``proj``.
    """
    if not isinstance(mlp_cls, type):
        raise TypeError(f"pass the class itself (TPMLP), got {type(mlp_cls).__name__}")
    if t not in (1, 2, 4):
        raise ValueError(f"t must be 1, 2 or 4 (it must divide the {4 * TP_CONFIG.d_model} hidden "
                         f"units and the {TP_CONFIG.n_head} heads), got {t!r}")
    return run(_mlp_rank, t, mlp_cls, seed, threads=1)


def _fg_rank(f: Callable, g: Callable, seed: int) -> dict:
    """On each rank: the MLP split with the learner's f and g; everything the feedback needs."""
    rank, t = dist.get_rank(), dist.get_world_size()
    dense, x, w, y_dense, xgrad_dense = _dense(seed)
    width = 4 * TP_CONFIG.d_model // t
    fc = _slice_linear(dense.fc, rows=torch.arange(rank * width, (rank + 1) * width))
    proj = _slice_linear(dense.proj, cols=slice(rank * width, (rank + 1) * width), bias=False)
    bias = dense.proj.bias.detach()
    xl = x.clone().requires_grad_()   # this rank's own contribution, without any communication
    local = proj(F.gelu(fc(xl)))
    (xgrad_local,) = torch.autograd.grad((local * w).sum(), xl)
    out = {"x": x, "sum": y_dense - bias, "own": local.detach(), "xgrad_dense": xgrad_dense,
           "xgrad_local": xgrad_local, "dense_slices": _slices(dense, rank, t)}
    xs = x.clone().requires_grad_()
    z = f(xs, None)
    out["f"] = z.detach().clone() if isinstance(z, torch.Tensor) else type(z).__name__
    if not isinstance(z, torch.Tensor):
        return out
    partial = proj(F.gelu(fc(z)))
    y = g(partial, None)
    out["g"] = y.detach().clone() if isinstance(y, torch.Tensor) else type(y).__name__
    if not isinstance(y, torch.Tensor):
        return out
    ((y + bias) * w).sum().backward()
    out["xgrad"] = None if xs.grad is None else xs.grad.clone()
    out["grads"] = {"fc.weight": fc.weight.grad, "fc.bias": fc.bias.grad,
                    "proj.weight": proj.weight.grad}
    return out


def _ratio(mine, reference, tol: dict, t: int, what: str, rank: int) -> str | None:
    """None if equal; else what is off: t times too large, 1/t, or just different."""
    if _close(mine, reference, tol):
        return None
    scale = (lambda d, k: {n: v * k for n, v in d.items()}) if isinstance(reference, dict) \
        else (lambda v, k: v * k)
    if _close(mine, scale(reference, t), tol):
        return f"on rank {rank}, {what} is {t}× the dense one (t = {t})"
    if _close(mine, scale(reference, 1 / t), tol):
        return f"on rank {rank}, {what} is 1/{t} of the dense one: averaged rather than added"
    return f"on rank {rank}, {what} differs from the dense MLP's"


def _feedback(res: dict, rank: int, t: int) -> str | None:
    """The first thing that is off on this rank, said without the solution; None: all right."""
    for name, label in (("f", "f"), ("g", "g")):
        if name in res and not isinstance(res[name], torch.Tensor):
            return f"{label} returned {res[name]}, not a tensor (return the result of your Function's apply)."
    if res["f"].shape != res["x"].shape:
        return f"f changed the shape of its input on rank {rank}."
    if not _close(res["f"], res["x"], OUT_TOL):
        scaled = f" ({t}× its input)" if _close(res["f"], res["x"] * t, OUT_TOL) else ""
        return (f"in forward, f's output on rank {rank} differs from its input{scaled}; "
                "f must leave the replicated input unchanged in forward.")
    y = res["g"]
    if not _close(y, res["sum"], OUT_TOL):
        if _close(y, res["own"], OUT_TOL):
            return (f"after g, rank {rank} holds only its own partial output: the {t} ranks' "
                    "partial sums were never added, so the output differs from the dense MLP.")
        return "in forward, " + _ratio(y, res["sum"], OUT_TOL, t, "the output of g", rank) + "."
    if res["xgrad"] is None:
        return f"x.grad is None on rank {rank}: f's backward returned no gradient for x."
    if _close(res["xgrad"], res["xgrad_local"], GRAD_TOL):
        return (f"the output is right, but x.grad on rank {rank} holds only the gradient through "
                "its own slice of the MLP: the other ranks' contributions are missing.")
    wrong = _ratio(res["xgrad"], res["xgrad_dense"], GRAD_TOL, t, "the gradient of the input x", rank)
    if wrong:
        return f"the output is right, but {wrong}."
    wrong = _ratio(res["grads"], res["dense_slices"], GRAD_TOL, t,
                   "the gradient of the fc/proj shards", rank)
    if wrong:
        return (f"the output and x.grad are right, but {wrong}: the gradient of the output "
                "was changed on its way back to proj.")
    return None


def check_f_and_g(f: Callable, g: Callable, t: int = 2, seed: int = 0) -> tuple[bool, str]:
    """Run the MLP split over ``t`` real ranks with the learner's ``f`` and ``g``; compare with dense.

    ``f(x, group)`` goes where the replicated input enters the column-parallel ``fc``, ``g(y,
    group)`` after the row-parallel ``proj`` (its bias is added after ``g``, by the check).
    Returns ``(passed, message)`` for :func:`course_lib.check_true`; the message says what is
    off (f's forward, the output after g, x.grad, the weight gradients) and on which rank.
    """
    for name, fn in (("f", f), ("g", g)):
        if not callable(fn):
            raise TypeError(f"pass your function {name} itself (no parentheses), "
                            f"got {type(fn).__name__}")
    if t not in (2, 4):
        raise ValueError(f"t must be 2 or 4 (one rank has nothing to communicate), got {t!r}")
    results = run(_fg_rank, t, f, g, seed, threads=1, timeout=60)
    for rank, res in enumerate(results):
        problem = _feedback(res, rank, t)
        if problem:
            return False, problem
    return True, (f"with your f and g the MLP split over {t} real ranks gives the dense output, "
                  "x.grad and weight gradients on every rank.")


def check_block_bytes(answer) -> Feedback:
    """Exercise 3: bytes one rank all-reduces per block, forward + backward (b=4, s=512, h=1024,
    fp32, t=4); the expected value stays here, off the page."""
    expected = expected_block_bytes(batch=4, seq=512, d_model=1024)
    return check_number(answer, expected["forward"] + expected["backward"], name="TP bytes per block",
                        unit="B", hint="count the all-reduces of one block in both directions, "
                                       "and what each one carries; does t change it?")


def check_pipeline_micro_batches(answer) -> Feedback:
    """Exercise 7: micro-batches per pipeline per step for Megatron-LM's flags on 128 GPUs."""
    layout = megatron_layout(128, 8, 4, micro_batch_size=2, global_batch_size=512)
    return check_number(answer, layout.micro_batches, name="micro-batches",
                        hint="how many data-parallel replicas are left once TP and PP have taken "
                             "their ranks? Each gets an equal share of the global batch.")
