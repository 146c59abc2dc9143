"""Chapter 1's code exercise: a learner's byte count of the model states, against the tracker.

:func:`check_state_bytes` runs the learner's ``state_bytes(model, optimizer)`` on two real
ranks (``course_lib.run``), each right after two real training steps measured by chapter 1's
tracker (:func:`course_lib.memory.tracker.tracked_steps`): rank 0 trains a GPT with fp32
``torch.optim.Adam``; rank 1 a GPT with tied embeddings in mixed precision (bf16 weights,
:class:`~course_lib.memory.mixed.MixedPrecisionAdam`). The expected bytes are what torch's
tracker measured, not a formula; the feedback says which category is off and how (a ratio, a
pattern), never by how many bytes. For ``course_lib.check_true``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.distributed as dist

from course_lib.common.models import GPT, get_config
from course_lib.launcher.launch import run
from course_lib.memory.mixed import MixedPrecisionAdam
from course_lib.memory.tracker import tracked_steps

__all__ = ["check_state_bytes", "CATEGORIES"]

#: The keys ``state_bytes`` must return, in the tracker's report names.
CATEGORIES = ("params", "grads", "optimizer")
_SETUPS = ("fp32 Adam", "mixed precision, tied embeddings")


def _as_number(value: object) -> object:
    """An int for ints and one-element tensors; otherwise the value's type name (for feedback)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return type(value).__name__
    return value


def _check_rank(fn: Callable, seed: int) -> dict:
    """On each rank: two measured steps of this rank's setup, then the learner's count."""
    rank = dist.get_rank()
    torch.manual_seed(seed + rank)
    config = get_config("tiny").replace(n_layer=1, tie_weights=rank == 1)
    model = GPT(config, dtype=torch.bfloat16 if rank == 1 else None)
    optimizer = (MixedPrecisionAdam(model.parameters()) if rank == 1
                 else torch.optim.Adam(model.parameters()))
    tokens = torch.randint(0, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(seed))
    report = tracked_steps(model, optimizer, (tokens[:, :-1].clone(), tokens[:, 1:].clone()),
                           loss_fn=GPT.loss)
    params = list(model.parameters())
    facts = {"tensors": len(params), "elements": {
        "params": sum(p.numel() for p in params),
        "grads": sum(p.grad.numel() for p in params if p.grad is not None),
        "optimizer": sum(t.numel() for s in optimizer.state.values() for t in s.values()
                         if isinstance(t, torch.Tensor))}}
    answer = fn(model, optimizer)
    if isinstance(answer, dict):
        answer = {key: _as_number(value) for key, value in answer.items()}
    else:
        answer = type(answer).__name__
    return {"answer": answer, "measured": {k: report[k] for k in CATEGORIES}, **facts}


def _verdict(key: str, mine: object, measured: int, facts: dict) -> str | None:
    """None when right; otherwise how this category is off, without the expected number."""
    if isinstance(mine, str):
        return f"a {mine}, expected a number of bytes"
    if mine == measured:
        return None
    if isinstance(mine, float) and math.isnan(mine):
        return "NaN"
    if mine == facts["elements"][key]:
        return "counted in elements, not bytes (a tensor takes numel() × element_size() bytes)"
    if key == "optimizer" and measured - mine == 4 * facts["tensors"]:
        return ("short by exactly 4 bytes per parameter *tensor*: besides its per-parameter "
                "tensors, Adam keeps something small for each tensor (print optimizer.state[p] "
                "for one p)")
    ratio = mine / measured if measured else float("inf")
    hint = ""
    if key == "optimizer" and 0.4 < ratio < 0.6:
        hint = ": how many moments does Adam keep per parameter?"
    elif key == "params" and ratio > 1:
        hint = ": is a tensor counted twice? (tied weights are one Parameter)"
    return f"{ratio:.2f}× what the tracker measured{hint}"


def check_state_bytes(fn: Callable, world: int = 2, seed: int = 0) -> tuple[bool, str]:
    """Run the learner's ``fn(model, optimizer)`` on real ranks after measured training steps.

    ``fn`` must return ``{"params": ..., "grads": ..., "optimizer": ...}`` in bytes, computed
    from the tensors. Returns ``(passed, message)`` for :func:`course_lib.check_true`.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself (state_bytes, no parentheses), "
                        f"got {type(fn).__name__}")
    if world not in (1, 2):
        raise ValueError(f"world must be 1 or 2 (rank 0: fp32 Adam, rank 1: mixed precision), "
                         f"got {world!r}")
    results = run(_check_rank, world, fn, seed, device="cpu", threads=1)
    for rank, res in enumerate(results):
        answer, setup = res["answer"], _SETUPS[rank]
        if isinstance(answer, str):
            return False, (f"on rank {rank} your function returned a {answer}; return a dict "
                           f"with the keys {list(CATEGORIES)} (bytes).")
        missing = [k for k in CATEGORIES if k not in answer]
        if missing:
            return False, f"on rank {rank} your dict has no key {missing[0]!r}."
        problems: dict[str | None, list[str]] = {}  # verdict -> categories, so each is said once
        for k in CATEGORIES:
            problems.setdefault(_verdict(k, answer[k], res["measured"][k], res), []).append(k)
        right = problems.pop(None, [])
        if problems:
            said = "; ".join(f"{', '.join(keys)}: {problem}" for problem, keys in problems.items())
            ok = f" ({', '.join(right)}: right)" if right else ""
            return False, f"rank {rank} ({setup}): {said}{ok}."
    done = " and ".join(_SETUPS[:world])
    return True, f"your bytes equal what torch's tracker measured, per category ({done})."
