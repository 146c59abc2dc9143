"""Chapter 2's build-it exercise: the learner's whole DDP class, checked on real ranks.

:func:`check_ddp_class` wraps the course GPT (tied embeddings, one frozen parameter) in the
learner's ``cls(module)`` on 2 ranks next to torch's ``DistributedDataParallel`` and compares the
gradients after ``finish_gradient_synchronization()``: one plain step, then two micro-batches
with the first under ``no_sync()``. While the learner's code runs, ``dist.all_reduce`` is
wrapped: the real all-reduce runs, but an asynchronous one's sum reaches the tensor only at
``wait()`` — the worst a real race can do, made certain — and the wrapper counts the calls made
during backward, so a forgotten ``wait()``, traffic under ``no_sync()`` or a blocking all-reduce
inside the hook fail every time rather than now and then.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.launcher.launch import run

__all__ = ["check_ddp_class"]


class _LateWork:
    """An async all-reduce's handle whose sum lands in the tensor only when ``wait()`` is called."""

    def __init__(self, work, result: torch.Tensor, target: torch.Tensor, seen: dict) -> None:
        self.work, self.result, self.target, self.seen = work, result, target, seen

    def wait(self, *args, **kwargs) -> bool:
        self.work.wait()
        self.target.copy_(self.result)
        self.seen["waits"] += 1
        self.seen["blocking"] += self.seen["in_backward"]
        return True

    def __getattr__(self, name: str):
        return getattr(self.work, name)


def _late_all_reduce(seen: dict):
    real = dist.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        seen["calls"] += 1
        seen["in_no_sync"] += seen["no_sync"]
        if not async_op:
            seen["blocking"] += seen["in_backward"]
            return real(tensor, op=op, group=group)
        result = tensor.detach().clone()      # what the ranks send: the tensor at launch
        return _LateWork(real(result, op=op, group=group, async_op=True), result, tensor, seen)
    return all_reduce


def _grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _check_rank(cls: type, seed: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank)                 # different: the broadcast must fix it
    model = GPT(get_config("tiny").replace(tie_weights=True))
    model.pos_emb.weight.requires_grad_(False)     # frozen: no gradient, no hook
    reference = DDP(copy.deepcopy(model))         # broadcasts rank 0's weights, as yours should
    seen = {"calls": 0, "waits": 0, "blocking": 0, "in_no_sync": 0, "in_backward": False,
            "no_sync": False}
    out = {"steps": []}
    with mock.patch.object(dist, "all_reduce", _late_all_reduce(seen)):
        try:
            mine = cls(model)
        except NotImplementedError:
            raise
        except Exception as error:                 # noqa: BLE001 - reported to the learner
            return {"error": f"{cls.__name__}(model) raised {type(error).__name__}: {error}"}
        if not isinstance(mine, nn.Module) or getattr(mine, "module", None) is not model:
            return {"error": f"{cls.__name__}(model) must return an nn.Module whose .module is "
                             "the model"}
        inputs, targets = get_batch(4, 16, seed=seed, rank=rank, world_size=world)
        for micro in (1, 2):                       # one plain step, then 2 micro-batches
            for wrapped in (mine, reference):
                wrapped.zero_grad(set_to_none=True)
                for m in range(micro):
                    rows = slice(m * 4 // micro, (m + 1) * 4 // micro)
                    syncing, counted = m == micro - 1, wrapped is mine
                    seen["no_sync"], seen["in_backward"] = counted and not syncing, counted
                    with nullcontext() if syncing else wrapped.no_sync():
                        (GPT.loss(wrapped(inputs[rows]), targets[rows]) / micro).backward()
                    seen["no_sync"] = seen["in_backward"] = False
                if wrapped is mine:
                    local = _grads(model)
                    mine.finish_gradient_synchronization()
            out["steps"].append({"mine": _grads(model), "ddp": _grads(reference.module),
                                 "local": local})
    return out | {k: seen[k] for k in ("calls", "waits", "blocking", "in_no_sync")}


def _close(a: torch.Tensor | None, b: torch.Tensor | None, scale: float = 1.0) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.allclose(a, b * scale, rtol=1e-5, atol=1e-8)   # fp32 sums in another order


def _verdict(res: dict, rank: int, world: int) -> str | None:
    """What is wrong on this rank (None: nothing)."""
    if "error" in res:
        hint = (" — hook only the parameters that require a gradient."
                if "hook" in res["error"] else "")
        return f"on rank {rank}: {res['error']}{hint}"
    if res["in_no_sync"]:
        return (f"your hook all-reduced {res['in_no_sync']} gradients during a backward under "
                "no_sync(): inside it nothing should be sent, the gradients only accumulate.")
    if res["blocking"]:
        return ("your code waited for an all-reduce during backward (a blocking all_reduce or "
                "wait() in the hook): correct, but backward stalls on every message and nothing "
                "overlaps. Launch with async_op=True, wait in finish_gradient_synchronization().")
    for label, step in zip(("the plain step", "the accumulated step"), res["steps"]):
        names = [n for n in step["ddp"] if not _close(step["mine"][n], step["ddp"][n])]
        if not names:
            continue
        name = names[0]
        mine, ddp = step["mine"][name], step["ddp"][name]
        if mine is None or ddp is None:
            state = "None" if mine is None else "a gradient"
            return f"in {label}, {name}.grad is {state} after your finish; DDP's is " + \
                ("None (it is frozen)." if ddp is None else "set.")
        if all(_close(step["mine"][n], step["local"][n]) or
               _close(step["mine"][n], step["local"][n], 1 / world) for n in names):
            if res["calls"] > res["waits"]:
                return (f"in {label} the all-reduced sums never reached .grad ({name} holds this "
                        "rank's own gradient): wait() on every handle before using the result.")
            return f"in {label}, {name}.grad was never all-reduced on rank {rank}."
        if _close(mine, ddp, world):
            return (f"in {label}, {name}.grad is {world}× DDP's on {world} ranks: you summed; "
                    "divide by the world size to average.")
        return f"in {label}, {name}.grad on rank {rank} differs from torch DDP's."
    return None


def check_ddp_class(cls: type, world: int = 2, seed: int = 0) -> tuple[bool, str]:
    """Train the learner's ``cls(module)`` next to torch's DDP on ``world`` real ranks.

    Returns ``(passed, message)`` for :func:`course_lib.check_true`.
    """
    if not callable(cls):
        raise TypeError(f"pass your class itself (no parentheses), got {type(cls).__name__}")
    if not isinstance(world, int) or isinstance(world, bool) or world < 2:
        raise ValueError(f"world must be an integer >= 2, got {world!r}")
    results = run(_check_rank, world, cls, seed, device="cpu", threads=1)
    for rank, res in enumerate(results):
        problem = _verdict(res, rank, world)
        if problem:
            return False, problem
    return True, (f"your class gives torch DDP's gradients on {world} ranks (tied embeddings, a "
                  "frozen parameter, 2 micro-batches under no_sync), overlapping backward.")
