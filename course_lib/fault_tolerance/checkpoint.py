"""Sharded checkpoints that are either complete or ignored: save, pick the latest, resume.

Chapter 06. Each rank of an FSDP2 model writes only its own shards with DCP
(:mod:`torch.distributed.checkpoint`), plus its RNG states, into a fresh ``step_00000s.tmp``;
after a barrier rank 0 writes ``manifest.json`` (step, world size, shapes, every file's size and
SHA-256) last and renames the folder (:mod:`course_lib.fault_tolerance.commit`). Loading
reshards (saved by 2 ranks, loaded by 4 or 1); RNG states are restored only at the same world
size. A checkpoint is data, never code, and reading one reaches nothing outside its folder
(:mod:`course_lib.fault_tolerance.checkpoint_safe`); ``load_checkpoint`` checks all it can
before touching the model and puts it back if reading the shards fails. The layout on disk and
the trust boundary in full: docs/modules/fault_tolerance.md (checkpoint.py).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import stat
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from course_lib.common.checks import is_int
from course_lib.fault_tolerance.checkpoint_load import (  # noqa: F401 - load_*, resume_* re-exported
    _rank_world, _shapes, load_checkpoint, resume_latest)
from course_lib.fault_tolerance.commit import publish, save_sharded, write_atomic
from course_lib.fault_tolerance.manifest import (FORMAT, MANIFEST, CheckpointError,
                                                 checkpoint_name, checkpoint_status,
                                                 complete_checkpoints, file_sha256,
                                                 latest_checkpoint, verify_checkpoint)

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "resume_latest", "checkpoint_status", "verify_checkpoint", "checkpoint_name",
           "MANIFEST", "FORMAT"]


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _own_root(root: Path) -> None:
    """Refuse a root that another user owns or every user may write to (o+w): they could swap
    or plant files. A group-writable root is accepted (a umask of 002 makes every folder so)."""
    st = os.stat(root)
    if st.st_uid != os.geteuid():
        raise CheckpointError(f"{root.name}: owned by another user (uid {st.st_uid}): keep "
                              "checkpoints in a folder of your own, e.g. one made by mkdtemp")
    if st.st_mode & stat.S_IWOTH:
        raise CheckpointError(f"{root.name}: other users can write to this folder (mode "
                              f"{stat.S_IMODE(st.st_mode):o}): keep checkpoints in one of yours")


def _remove(path: Path) -> None:
    """Remove ``path`` itself: a symlink is unlinked, never followed."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def save_checkpoint(root: str | Path, step: int, model: nn.Module,
                    optimizer: torch.optim.Optimizer, *, meta: dict | None = None,
                    keep: int | None = 2, before_commit: Callable[[], None] | None = None) -> Path:
    """Save model + optimizer shards, RNG states and ``meta`` as checkpoint ``step``; collective.

    Every rank must call it. ``meta`` (JSON-serialisable, e.g. the loss history) goes into the
    manifest. The ``keep`` newest complete checkpoints are kept, this one first (older complete
    ones and stale ``.tmp`` directories are deleted; a folder that does not verify is never
    counted nor deleted); ``None`` keeps all. ``before_commit`` runs on every rank after all shards are
    written and before the marker: fault injection uses it to die in the middle of a save.
    Returns the committed directory.
    """
    name = checkpoint_name(step)
    if keep is not None and (not is_int(keep) or keep < 1):
        raise ValueError(f"keep must be a positive integer or None, got {keep!r}")
    meta = dict(meta or {})
    json.dumps(meta)  # fail before writing anything if meta is not JSON
    root = Path(root)
    rank, world = _rank_world()
    tmp, final = root / (name + ".tmp"), root / name
    root.mkdir(parents=True, exist_ok=True)  # every rank: the same check, the same verdict
    _own_root(root)
    if rank == 0:
        _remove(tmp)  # a half-written attempt at this same step, or a planted link
        tmp.mkdir()
    _barrier()
    shapes = _shapes(get_state_dict(model, optimizer)[0])
    save_sharded(tmp, model, optimizer)  # commit.py: DCP, every rank its own shards
    extra = {"step": step, "rank": rank, "torch_rng": torch.get_rng_state(),
             "python_rng": random.getstate()}
    extra_path = tmp / f"rank{rank}.pt"
    torch.save(extra, extra_path)
    with open(extra_path, "rb") as f:
        os.fsync(f.fileno())
    _barrier()  # every rank has written everything
    if before_commit is not None:
        before_commit()
    _barrier()  # ... and is still alive: only now may the marker be written
    if rank == 0:
        files = sorted(p.name for p in tmp.iterdir() if p.is_file() and p.name != MANIFEST)
        manifest = {"format": FORMAT, "step": step, "world_size": world, "meta": meta,
                    "model_shapes": shapes, "optimizer": type(optimizer).__name__,
                    "files": {f: {"bytes": (tmp / f).stat().st_size,
                                  "sha256": file_sha256(tmp, f)} for f in files}}
        _remove(final)  # same step committed before (a resumed run redoing it)
        publish(tmp, final, json.dumps(manifest, indent=1))  # commit.py: marker, rename
        write_atomic(root / "latest", name + "\n")
        if keep is not None:
            _prune(root, keep, step)
    _barrier()
    return final


def _prune(root: Path, keep: int, newest: int) -> None:
    """Delete committed checkpoints beyond the ``keep`` newest *complete* ones (the one just
    saved always counts among them) and unfinished ``.tmp`` saves older than ``newest``. A
    folder that does not verify (empty, malformed manifest, unreadable) is never counted and
    never deleted: it can neither push a good checkpoint out nor be lost because of a bug."""
    just_saved = root / checkpoint_name(newest)
    good = [p for p in complete_checkpoints(root) if p != just_saved]  # newest step first
    for path in good[keep - 1:]:
        shutil.rmtree(path, ignore_errors=True)
    for path in root.glob("step_*.tmp"):
        step = int(path.name[5:-4]) if path.name[5:-4].isdigit() else -1
        if step < newest:
            _remove(path)
