"""Typed results: dataclasses the notebooks read by attribute (``report.world``).

:class:`Record` keeps the old string keys one release: ``report["world"]`` still answers, with a
``DeprecationWarning`` naming the attribute to use instead.
"""
from __future__ import annotations

import dataclasses
import warnings

__all__ = ["Record"]


class Record:
    """Base of a result dataclass: ``record["name"]`` (deprecated) reads ``record.name``."""

    def _names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self))

    def __getitem__(self, key: str):
        if key not in self._names():
            raise KeyError(key)
        warnings.warn(f"{type(self).__name__}[{key!r}] is deprecated; read the attribute "
                      f".{key}", DeprecationWarning, stacklevel=2)
        return getattr(self, key)

    def __contains__(self, key: str) -> bool:
        return key in self._names() and getattr(self, key) is not None

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def keys(self) -> tuple[str, ...]:
        return self._names()
