"""The result of a memory measurement: bytes per category, a timeline, and a printable table.

:func:`course_lib.memory.tracker.measure_step` (chapter 1) and the distributed measurements of later
chapters return a :class:`MemoryReport`. It reads like a dict (``report["params"]``) and prints
as a table in a notebook. Categories come from torch's trackers
(``torch.distributed._tools.mem_tracker.MemTracker`` and its FSDP2 variant ``FSDPMemTracker``)
and are renamed to short keys by :func:`categorize`.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CATEGORY_KEYS", "MemoryReport", "categorize", "byte_unit", "format_bytes"]

#: Tracker category name -> report key. FSDP2's sharded params/grads count as params/grads.
CATEGORY_KEYS: dict[str, str] = {
    "Parameter": "params", "Sharded Param": "params", "Unsharded Param": "unsharded_params",
    "Buffer": "buffers", "Gradient": "grads", "Sharded Grad": "grads",
    "Unsharded Grad": "unsharded_grads", "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations", "Temp": "temporaries", "Other": "inputs", "Inputs": "inputs",
    "All Gather": "all_gather", "Reduce Scatter": "reduce_scatter",
}
#: Keys every report has, in display order (plots stack them in this order).
STATE_KEYS = ("params", "buffers", "grads", "optimizer")
FLOW_KEYS = ("activations", "temporaries", "inputs")
_SHOWN_INFO = ("mode", "precision", "optimizer", "recompute", "batch", "fake", "device")


def categorize(snapshot: Mapping[Any, Mapping[str, int]]) -> dict[str, int]:
    """Sum a tracker snapshot ``{device: {category: bytes}}`` over devices, with report keys."""
    out = dict.fromkeys(STATE_KEYS + FLOW_KEYS, 0)
    for per_device in snapshot.values():
        for name, nbytes in per_device.items():
            if name == "Total":
                continue
            key = CATEGORY_KEYS.get(str(getattr(name, "value", name)), str(name).lower())
            out[key] = out.get(key, 0) + int(nbytes)
    return out


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """``(unit, bytes per unit)``: the largest binary unit ``max_bytes`` fills (an axis' unit)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= scale:
            return unit, scale
    return "B", 1


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``: binary units, three significant decimals."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(repr=False)
class MemoryReport(Mapping):
    """Measured bytes per category, and how they evolved over the measured steps.

    ``bytes`` holds ``params``, ``buffers``, ``grads``, ``optimizer`` (from the "current"
    snapshot after the last optimizer step), ``model_states`` (their sum), ``activations``
    (alive at the end of the last forward), ``temporaries`` and ``inputs`` (at the peak
    moment) and ``peak`` (the largest total seen). ``timeline`` lists ``(phase, {category:
    bytes})`` after every phase, ``peak_breakdown`` what was alive at the peak, ``info`` how it
    was measured (precision, optimizer, batch shape, fake, device). On a GPU ``bytes`` also holds
    ``cuda_max_allocated``, the caching allocator's own peak.
    """

    bytes: dict[str, int]
    timeline: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    n_params: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> int:
        return self.bytes[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.bytes)

    def __len__(self) -> int:
        return len(self.bytes)

    def per_param(self, key: str) -> float:
        """Bytes of one category divided by the number of parameters."""
        return self.bytes[key] / self.n_params if self.n_params else float("nan")

    def table(self, predicted: Mapping[str, int] | None = None) -> str:
        """The report as a text table; with ``predicted``, a column of predictions beside it."""
        head = f"{'category':<13}{'bytes':>16}{'':>12}{'B/param':>9}"
        if predicted is not None:
            head += f"{'predicted':>16}{'ratio':>8}"
        lines = [head]
        for key, nbytes in self.bytes.items():
            line = f"{key:<13}{nbytes:>16,}{format_bytes(nbytes):>12}{self.per_param(key):>9.2f}"
            if predicted is not None and key in predicted:
                want = predicted[key]  # "-": nothing predicted and nothing measured (no nan)
                ratio = f"{nbytes / want:>8.3f}" if want else f"{'-' if nbytes == 0 else 'n/a':>8}"
                line += f"{want:>16,}{ratio}"
            lines.append(line)
        setup = ", ".join(f"{k}={v}" for k, v in self.info.items()
                          if k in _SHOWN_INFO and (k, v) != ("recompute", "none"))
        return f"MemoryReport({self.n_params:,} params; {setup})\n" + "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()

