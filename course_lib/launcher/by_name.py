"""A rank function named by its module and name, so that the caller's process never imports it.

:func:`course_lib.run` ships a library function by reference, but to hand it over the notebook
must hold it, and holding it means importing its module: for the capstone's training ranks that
is FSDP2, DTensor, DCP and sympy, ~0.05 GiB in a kernel that never runs them.
``ByName("course_lib.capstone.train", "rank_entry")`` is a small picklable callable that imports
the module when a rank calls it; the warm server imports the module once before it forks (the
``preimport`` attribute), as it does for a function shipped by reference.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

__all__ = ["ByName"]


@dataclasses.dataclass(frozen=True)
class ByName:
    """``module.name``, imported and called in the rank: ``ByName(module, name)(*args)``."""

    module: str
    name: str

    @property
    def preimport(self) -> tuple[str, ...]:
        return (self.module,)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)
