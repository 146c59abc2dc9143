"""Recompute instead of store: what each recomputation mode saves, and what it costs in time.

Chapter 1 (``01_training_memory``) puts the three modes of :meth:`GPT.set_recompute` side by
side: bytes from :func:`course_lib.memory.tracker.measure_step` (torch's tracker) next to
:mod:`course_lib.memory.predict`, and seconds from a plain timer around forward + backward run
*without* the tracker (its per-operator bookkeeping would swamp the time). Times depend on the
machine and its load: they are reported, never asserted.
"""
from __future__ import annotations

import time

import torch

from course_lib.common.models import GPT, RECOMPUTE, get_config
from course_lib.memory import predict
from course_lib.memory.tracker import measure_step

__all__ = ["time_step", "tradeoff"]

_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "mixed": torch.bfloat16}


def time_step(config, batch: tuple[int, int], recompute: str = "none", precision: str = "fp32",
              repeats: int = 5, seed: int = 0) -> dict[str, float]:
    """Seconds of the forward alone and of forward + backward: the fastest of ``repeats`` runs
    (as ``timeit`` advises: slower runs measure the machine's other work), after one warm-up.

    Full recomputation should add about one forward to the backward.
    """
    predict.validate(precision, recompute=recompute)
    if precision not in _DTYPE:
        raise ValueError(f"time_step supports precision in {tuple(_DTYPE)}, got {precision!r}")
    config = get_config(config)
    torch.manual_seed(seed)
    model = GPT(config, dtype=_DTYPE[precision]).set_recompute(recompute)
    b, s = batch
    tokens = torch.randint(0, config.vocab_size, (b, s + 1), generator=torch.Generator().manual_seed(seed))
    x, y = tokens[:, :-1], tokens[:, 1:]
    forward, step = [], []
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = GPT.loss(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if i:  # the first run warms up the allocator and kernels
            forward.append(t1 - t0)
            step.append(t2 - t0)
    return {"forward_s": min(forward), "step_s": min(step)}


def tradeoff(config, shapes: list[tuple[int, int]], modes: tuple[str, ...] = RECOMPUTE,
             precision: str = "fp32", repeats: int = 5) -> list[dict]:
    """One row per (shape, mode): measured and predicted activations and peak, and seconds.

    ``extra_forwards`` is the measured extra time of forward + backward over ``"none"`` at the
    same shape, in units of that shape's forward: about 1 for ``"full"``, small for ``"selective"``.
    ``repeats=0`` measures bytes only (no timing keys): what a notebook may store as output.
    """
    rows = []
    for shape in shapes:
        times = {m: time_step(config, shape, m, precision, repeats)
                 for m in dict.fromkeys(("none", *modes))} if repeats else {}
        for mode in modes:
            report = measure_step(config, shape, precision=precision, recompute=mode)
            row = {"batch": shape[0], "seq_len": shape[1], "recompute": mode,
                   "activations": report["activations"],
                   "activations_predicted": predict.activation_bytes(config, *shape, precision, mode),
                   "peak": report["peak"],
                   "peak_predicted": predict.peak_bytes(config, *shape, precision, "adam", mode)}
            if times:
                base = times["none"]
                row.update(**times[mode], extra_forwards=(times[mode]["step_s"] - base["step_s"])
                           / base["forward_s"])
            rows.append(row)
    return rows
