"""Argument checks shared by every chapter: clear errors before any process starts.

``bool`` is an ``int`` in Python; a count given as ``True`` is a mistake, so it is refused.
"""
from __future__ import annotations

__all__ = ["is_int", "positive_int", "non_negative_int"]


def is_int(value: object) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: object, name: str) -> int:
    """``value`` if it is an integer >= 1, else ``ValueError("<name> must be a positive integer")``."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(value: object, name: str) -> int:
    """``value`` if it is an integer >= 0, else a ``ValueError`` naming it."""
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value
