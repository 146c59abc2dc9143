"""The pipeline's pure formulas: no process, no launcher (chapter 12's step prediction uses them).
"""
from __future__ import annotations

__all__ = ["bubble_formula"]


def bubble_formula(p: int, m: int) -> float:
    """Idle fraction of a GPipe/1F1B step when every micro-batch costs the same: (p-1)/(m+p-1)."""
    return (p - 1) / (m + p - 1)
