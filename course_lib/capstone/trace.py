"""Where one step's time went, read from a ``torch.profiler`` trace (the Chrome-trace JSON that
``prof.export_chrome_trace(path)`` writes, and that Perfetto or ``chrome://tracing`` opens).

The step is the ``ProfilerStep#N`` annotation on the thread that ran it. Every CPU op on that
thread inside the step gets its own (self) time, its duration minus its children's; that time is
counted as **communication** when the op or an op around it is a collective (``c10d::``,
``gloo:``, ``nccl:``, ``record_param_comms``, ``_c10d_functional``, ``wait_tensor``), else as
**matmul** when the op or one around it is a matrix product (``aten::mm``, ``addmm``, ``bmm``,
``baddbmm``, scaled dot-product attention), else **optimizer** when it runs inside
``Optimizer.step`` (its Python too), else **other ops** (elementwise, norms, copies, the loss).
The rest of the step is **Python and launch** (the interpreter and hooks between ops).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StepShares", "step_shares", "CATEGORIES"]

CATEGORIES = ("communication", "matmul", "optimizer", "other ops", "Python and launch")
_COMM = ("c10d::", "gloo:", "nccl:", "record_param_comms", "_c10d_functional::",
         "c10d_functional::", "aten::wait_tensor", "_c10d_functional_autograd::")
_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation",
           "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
           "aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_backward"}


@dataclass(frozen=True)
class StepShares:
    """Seconds of one profiled step, per category (``seconds``), and the step's wall time."""

    step_s: float
    seconds: dict[str, float]

    def share(self, category: str) -> float:
        return self.seconds[category] / self.step_s if self.step_s else 0.0

    def __str__(self) -> str:
        parts = ", ".join(f"{c} {self.share(c):.0%}" for c in CATEGORIES)
        return f"one step {self.step_s * 1e3:.1f} ms: {parts}"


def _kind(name: str) -> str | None:
    if name.startswith(_COMM):
        return "communication"
    if name in _MATMUL:
        return "matmul"
    if name.startswith("Optimizer.step"):
        return "optimizer"
    return None


def step_shares(path: str | Path) -> StepShares:
    """The shares of the first ``ProfilerStep#`` in the trace at ``path``."""
    events = json.loads(Path(path).read_text())
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    steps = [e for e in spans if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep# annotation: profile with a schedule and "
                         "call prof.step(), or wrap the step in record_function('ProfilerStep#N')")
    step = min(steps, key=lambda e: e["ts"])
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    ops = sorted((e for e in spans if e is not step and e.get("tid") == step.get("tid")
                  and e.get("pid") == step.get("pid") and t0 <= e["ts"] < t1
                  and e.get("cat") in ("cpu_op", "user_annotation")),
                 key=lambda e: (e["ts"], -e["dur"]))
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    stack: list[tuple[dict, str | None, float]] = []  # (event, inherited kind, children's time)

    def close(upto: float) -> None:
        while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= upto:
            event, kind, children = stack.pop()
            own = max(0.0, event["dur"] - children)
            if event.get("cat") == "cpu_op":
                seconds[kind if kind in ("communication", "matmul", "optimizer") else "other ops"] += own
            elif kind == "optimizer":  # Python inside Optimizer.step, between its ops
                seconds["optimizer"] += own
            if stack:
                stack[-1] = (stack[-1][0], stack[-1][1], stack[-1][2] + event["dur"])

    for e in ops:
        close(e["ts"])
        inherited = stack[-1][1] if stack else None
        kind = _kind(str(e.get("name", "")))
        # a collective wins over anything around it; a matmul over the optimizer around it
        if inherited == "communication" or kind is None:
            kind = inherited if kind is None or inherited == "communication" else kind
        elif inherited == "matmul" and kind == "optimizer":
            kind = inherited
        stack.append((e, kind, 0.0))
    close(float("inf"))
    step_us = float(step["dur"])
    seconds["Python and launch"] = max(0.0, step_us - sum(seconds.values()))
    return StepShares(step_us / 1e6, {k: v / 1e6 for k, v in seconds.items()})
