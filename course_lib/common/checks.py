"""Argument checks shared by every chapter: clear errors before any process starts.

``bool`` is an ``int`` in Python; a count given as ``True`` is a mistake, so it is refused.
"""
from __future__ import annotations

__all__ = ["is_int", "positive_int", "non_negative_int", "batch_shape"]


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


def batch_shape(batch: object, max_seq_len: int, what: str = "positive ints") -> tuple[int, int]:
    """``(batch_size, seq_len)`` of positive ints with ``seq_len <= max_seq_len``, else ValueError."""
    if not (isinstance(batch, tuple) and len(batch) == 2 and all(is_int(n) and n > 0 for n in batch)):
        raise ValueError(f"with a config, batch must be (batch_size, seq_len) {what}, got {batch!r}")
    if batch[1] > max_seq_len:
        raise ValueError(f"seq_len={batch[1]} exceeds the config's seq_len={max_seq_len}")
    return batch
