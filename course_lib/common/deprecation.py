"""Old public names kept one release, with a ``DeprecationWarning`` (a module ``__getattr__``).

A renamed function keeps its old name importable (``from module import old`` and ``module.old``
both work) for one release; each use warns, naming the new name, and the old name is not in the
module's ``__all__`` (``import *`` does not warn). A module that moved as a whole keeps a file at
its old path calling :func:`moved_module`. ``tests/test_names.py`` checks every entry.
"""
from __future__ import annotations

import importlib
import importlib.util
import runpy
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

__all__ = ["renamed", "warn_renamed", "moved_to_benchmark", "moved_module"]


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated and ``new`` replaces it (removed in the next release)."""
    warnings.warn(f"{old} is deprecated: use {new} (the old name goes in the next release)",
                  DeprecationWarning, stacklevel=stacklevel)


def renamed(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each old name in ``names`` as its new one, with a warning.

    A new name is an attribute of ``module`` or ``"package.module.attribute"`` (a name that moved
    house); it is looked up on first use, so the new home is imported only then."""
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = names[name]
        home, _, attr = new.rpartition(".") if "." in new else (module, "", new)
        warn_renamed(f"{module}.{name}", new if "." in new else f"{module}.{new}")
        return getattr(sys.modules.get(home) or importlib.import_module(home), attr)
    return __getattr__


def moved_to_benchmark(module: str, names: tuple[str, ...], script: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names``, which moved to ``benchmarks/<script>``: loaded
    from that file of a source checkout on each use, with a warning naming it."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / script

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_renamed(f"{module}.{name}", f"{name} of benchmarks/{script}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return getattr(loaded, name)
    return __getattr__


def moved_module(namespace: dict, new: str) -> None:
    """The body of a module that moved house as a whole (a worker script): warn naming ``new``;
    run as a script (``python -m OLD``, ``python OLD.py``, under torchrun) it runs ``new`` as
    ``__main__``; imported, it takes ``new``'s names. ``namespace``: the old module's
    ``globals()``. The warning points at the old module, so ``-m OLD`` shows it (``__main__``)."""
    old = namespace["__spec__"].name if namespace.get("__spec__") else namespace["__file__"]
    warn_renamed(old, new, stacklevel=3)
    if namespace["__name__"] == "__main__":
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return
    module = importlib.import_module(new)
    namespace.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
