"""The faults chapter 6 injects: a :class:`Fault` says which rank fails, when and how.

A module of its own, light to import, so that a process which only names faults (the capstone's
notebook, ``train_gpt.py``'s argument parsing) does not import the training loop's FSDP2 and DCP;
:mod:`course_lib.fault_tolerance.training` hands the same names on and fires them in its ranks.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Sequence

from course_lib.common.checks import non_negative_int

__all__ = ["Fault", "FAULT_KINDS", "FAULTS_ENV", "parse_faults", "format_faults", "fire"]

FAULT_KINDS = ("kill", "raise", "save")
FAULTS_ENV = "COURSE_FT_FAULTS"


@dataclass(frozen=True)
class Fault:
    """Make ``rank`` fail at ``step`` during restart ``attempt`` (0 = the first launch)."""

    attempt: int
    rank: int
    step: int
    kind: str = "kill"

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS}, got {self.kind!r}")
        for name in ("attempt", "rank", "step"):
            non_negative_int(getattr(self, name), f"Fault.{name}")


def parse_faults(text: str) -> tuple[Fault, ...]:
    """``"0:1:5:kill,1:0:8:save"`` (attempt:rank:step:kind, comma-separated) → Faults."""
    faults = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        parts = item.split(":")
        if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
            raise ValueError(f"bad fault {item!r}: expected attempt:rank:step:kind, e.g. 0:1:5:kill")
        faults.append(Fault(int(parts[0]), int(parts[1]), int(parts[2]), parts[3]))
    return tuple(faults)


def format_faults(faults: Sequence[Fault]) -> str:
    """Inverse of :func:`parse_faults` (the value of ``COURSE_FT_FAULTS``)."""
    return ",".join(f"{f.attempt}:{f.rank}:{f.step}:{f.kind}" for f in faults)


def fire(fault: Fault) -> None:
    """Make this rank fail as ``fault`` says: raise, or SIGKILL itself (``kill``, ``save``)."""
    if fault.kind == "raise":
        raise RuntimeError(f"injected fault: rank {fault.rank} raised at step {fault.step}")
    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no traceback: like a lost node
