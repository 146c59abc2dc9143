"""Import DeepSpeed quietly, and ask whether it can train here (chapter 08).

DeepSpeed is an optional, heavy dependency: it is imported inside these functions, on first use,
never when ``course_lib`` loads. :func:`load_deepspeed` skips two costs training does not need:
the JIT build of DeepSpeed's shared-memory CPU all-reduce op (it serves tensor-parallel
inference only; training's collectives go through ``torch.distributed``) and the
``torch.compile`` of its Muon optimizer module (:func:`_import_muon_uncompiled`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings

import torch

__all__ = ["deepspeed_status", "load_deepspeed"]


def deepspeed_status(*, build_comm_op: bool = False) -> tuple[bool, str]:
    """``(True, version line)`` if DeepSpeed can train here, else ``(False, why)``.

    Checks that ``deepspeed`` imports (it is missing, or fails to import on an unsupported
    platform) and, with ``build_comm_op=True``, that its CPU communication op could be built: a
    C++ compiler (``$CXX`` or ``c++``/``g++``) and ``ninja`` on the ``PATH``, on Linux.
    """
    try:
        deepspeed = _import_deepspeed()
    except Exception as exc:  # ImportError, or anything its import raises on this platform
        return False, (f"DeepSpeed cannot be imported ({type(exc).__name__}: {exc}); "
                       "the chapter continues with torch's ZeroRedundancyOptimizer and FSDP2")
    if build_comm_op:
        if sys.platform != "linux":
            return False, (f"DeepSpeed's shared-memory CPU op needs Linux, not {sys.platform}; "
                           "use build_comm_op=False (training does not need it)")
        compiler = os.environ.get("CXX") or next(
            (c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
        if not compiler or not shutil.which(compiler.split()[0]):
            return False, ("no C++ compiler found on the PATH to build DeepSpeed's CPU "
                           "communication op; use build_comm_op=False (training does not need it)")
        if not shutil.which("ninja"):
            return False, "ninja is not on the PATH: DeepSpeed cannot JIT-build its CPU op"
    return True, f"DeepSpeed {deepspeed.__version__} with torch {torch.__version__}"


def _import_deepspeed():
    """``import deepspeed`` without its "no GPU found, using the CPU" warning on CPU machines."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's own override variable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import deepspeed
        import deepspeed.ops  # noqa: F401
    from deepspeed.utils import logger
    logger.setLevel("ERROR")
    return deepspeed


def _import_muon_uncompiled() -> None:
    """Import DeepSpeed's Muon optimizer module with its ``torch.compile`` decorators switched off.

    Every ZeRO-1/2/3 run imports ``deepspeed.runtime.zero.muon.muon_optimizer`` (to check whether
    the optimizer is Muon), and that module wraps three functions in ``torch.compile`` at import,
    which loads torch's inductor: 5-15 s per process on 2 busy cores. The course trains with Adam,
    never Muon, so the decorator is a pass-through during that one import and restored after.
    """
    if "deepspeed.runtime.zero.muon.muon_optimizer" in sys.modules:
        return
    from deepspeed.runtime import compiler
    original = compiler.compile
    compiler.compile = lambda *args, **kwargs: (lambda fn: fn)
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    except ImportError:
        pass
    finally:
        compiler.compile = original


def load_deepspeed(*, build_comm_op: bool = False):
    """Import DeepSpeed inside a rank (quiet logs); unless ``build_comm_op``, skip the shm op.

    Also imports DeepSpeed's Muon module without compiling it (:func:`_import_muon_uncompiled`).
    """
    deepspeed = _import_deepspeed()
    _import_muon_uncompiled()
    if not build_comm_op:
        # DeepSpeed's own table of buildable ops (probed once per process, meant to be edited)
        with _quiet_stderr():
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null for a moment: DeepSpeed's first look at its op table
    test-links each op (e.g. ``-laio``) and silences the linker through ``sys.stderr.fileno()``,
    which in a Jupyter kernel is not descriptor 2 — the linker's "cannot find -laio" would land
    in the cell."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
