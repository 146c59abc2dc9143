"""Sharded checkpoints that are either complete or ignored: save, pick the latest, resume.

Chapter 6 (``06_fault_tolerance``). Each rank of an FSDP2 (``fully_shard``) model writes only
its own shards with DCP (:mod:`torch.distributed.checkpoint`); a checkpoint of step ``s`` is

    root/step_00000s/   .metadata, __0_0.distcp, __1_0.distcp   (DCP: model + optimizer shards)
                        rank0.pt, rank1.pt                       (per rank: RNG states)
                        manifest.json                            (the commit marker, written last)
    root/latest                                                  ("step_00000s", a hint)

DCP makes each of its own saves safe against a reader only in one respect: torch 2.13 writes
``.metadata`` last (temp file, fsync, rename) after every rank's shards. It does not fsync the
directory, remove stale files of an earlier attempt, store checksums, or record what else a
checkpoint needs (step, RNG, loss history). So the commit protocol is ours:

1. every rank writes into a fresh ``step_00000s.tmp`` directory;
2. a barrier — every rank has finished writing (a rank that died never gets past it);
3. rank 0 writes ``manifest.json`` (step, world size, parameter shapes, every file with its size
   and SHA-256) to a temporary name, fsyncs it, renames it into place, and fsyncs the directory;
4. rank 0 renames ``step_00000s.tmp`` to ``step_00000s`` (atomic on POSIX) and replaces ``latest``
   the same way (write a temporary file, ``os.replace``).

A crash anywhere before step 4 leaves a ``.tmp`` directory, which :func:`latest_checkpoint` never
picks; it selects the highest *committed* directory whose manifest is valid and whose files are
all present with the right sizes (a crash between the two renames of step 4 leaves ``latest``
one checkpoint behind: the scan, not the hint, decides).

Loading reshards: a checkpoint saved by 2 ranks loads on 4 or on 1 (DCP reads each rank's slices
of every tensor, whatever the sharding that wrote them). Per-rank RNG states do not reshard;
they are restored only at the same world size and otherwise reseeded from (step, rank).

Trust boundary: loading runs no code from the checkpoint directory. DCP's ``.metadata`` (a
pickle) goes through a restricted unpickler, non-tensor items and per-rank state load with
``torch.load(weights_only=True)``, the manifest is JSON (:mod:`course_lib.fault_tolerance.checkpoint_safe`).
Checksums detect accidents, not an attacker who rewrites the manifest as well.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from course_lib.common.checks import is_int, non_negative_int
from course_lib.fault_tolerance.checkpoint_safe import UnsafeCheckpointError, read_metadata
from course_lib.fault_tolerance.commit import (MARKER, load_committed, publish, save_sharded,
                                               write_atomic)

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "checkpoint_status", "verify_checkpoint", "checkpoint_name", "MANIFEST", "FORMAT"]

MANIFEST = MARKER  # the commit marker (commit.py) holds the manifest
FORMAT = "course_lib.checkpoint/1"  # a data format name, not a module path: keep it
_COMMITTED = re.compile(r"^step_(\d{6,})$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: incomplete, corrupted, unsafe, or for another model."""


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint taken after ``step`` optimizer steps."""
    non_negative_int(step, "step")
    return f"step_{step:06d}"


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _shapes(model_sd: dict) -> dict[str, list[int]]:
    """Global shape of every model tensor (a DTensor shard reports the full shape)."""
    return {k: list(v.shape) for k, v in model_sd.items() if isinstance(v, torch.Tensor)}


def save_checkpoint(root: str | Path, step: int, model: nn.Module,
                    optimizer: torch.optim.Optimizer, *, meta: dict | None = None,
                    keep: int | None = 2, before_commit: Callable[[], None] | None = None) -> Path:
    """Save model + optimizer shards, RNG states and ``meta`` as checkpoint ``step``; collective.

    Every rank must call it. ``meta`` (JSON-serialisable, e.g. the loss history) goes into the
    manifest. ``keep`` committed checkpoints are kept (older ones and stale ``.tmp`` directories
    are deleted); ``None`` keeps all. ``before_commit`` runs on every rank after all shards are
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
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written attempt at this same step
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
        files = sorted(p for p in tmp.iterdir() if p.is_file() and p.name != MANIFEST)
        manifest = {"format": FORMAT, "step": step, "world_size": world, "meta": meta,
                    "model_shapes": shapes, "optimizer": type(optimizer).__name__,
                    "files": {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                              for p in files}}
        if final.exists():  # same step committed before (a resumed run redoing it)
            shutil.rmtree(final)
        publish(tmp, final, json.dumps(manifest, indent=1))  # commit.py: marker, rename
        write_atomic(root / "latest", name + "\n")
        if keep is not None:
            _prune(root, keep, step)
    _barrier()
    return final


def _prune(root: Path, keep: int, newest: int) -> None:
    committed = sorted((int(m.group(1)), p) for p in root.iterdir()
                       if (m := _COMMITTED.match(p.name)) and p.is_dir())
    for _, path in committed[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
    for path in root.glob("step_*.tmp"):
        step = int(path.name[5:-4]) if path.name[5:-4].isdigit() else -1
        if step < newest:
            shutil.rmtree(path, ignore_errors=True)


def verify_checkpoint(path: str | Path, *, checksums: bool = True) -> dict:
    """Return the manifest of committed checkpoint ``path``; raise CheckpointError if unusable.

    Checks: the directory name is a committed one, ``manifest.json`` exists and parses, its
    format and step match, every listed file exists with its size (and SHA-256 if
    ``checksums``), and no shard file is missing from the list.
    """
    path = Path(path)
    match = _COMMITTED.match(path.name)
    if not path.is_dir():
        raise CheckpointError(f"{path.name}: no such checkpoint directory")
    if match is None:
        raise CheckpointError(f"{path.name}: not a committed checkpoint (an unfinished save "
                              "ends in .tmp and is never loaded)")
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path.name}: no {MANIFEST} (commit marker): the save did not "
                              "finish") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path.name}: {MANIFEST} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path.name}: foreign checkpoint: manifest format "
                              f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                              f"expected {FORMAT!r}")
    if manifest.get("step") != int(match.group(1)):
        raise CheckpointError(f"{path.name}: manifest mismatch: it says step "
                              f"{manifest.get('step')!r}")
    listed = manifest.get("files", {})
    for fname, info in listed.items():
        file = path / fname
        if not file.is_file():
            raise CheckpointError(f"{path.name}: missing file {fname}")
        if file.stat().st_size != info["bytes"]:
            raise CheckpointError(f"{path.name}: {fname} has {file.stat().st_size} bytes, the "
                                  f"manifest says {info['bytes']} (truncated or overwritten)")
        if checksums and _sha256(file) != info["sha256"]:
            raise CheckpointError(f"{path.name}: checksum mismatch in {fname} (corrupted)")
    extra = sorted(p.name for p in path.iterdir() if p.name not in listed and p.name != MANIFEST)
    if extra:
        raise CheckpointError(f"{path.name}: manifest mismatch: files not in the manifest {extra}")
    return manifest


def checkpoint_status(root: str | Path) -> list[tuple[str, str]]:
    """Every ``step_*`` entry under ``root`` with a verdict: "complete" or why it is skipped."""
    root = Path(root)
    rows = []
    for path in sorted(root.glob("step_*")) if root.is_dir() else []:
        try:
            verify_checkpoint(path, checksums=False)
            rows.append((path.name, "complete"))
        except CheckpointError as exc:
            rows.append((path.name, "skipped: " + str(exc).split(": ", 1)[-1]))
    return rows


def latest_checkpoint(root: str | Path) -> Path | None:
    """The committed checkpoint with the highest step whose manifest and files check out.

    Directories ending in ``.tmp``, without a marker, or with missing/short files are skipped
    (sizes are checked here; checksums when loading). ``None`` when there is none.
    """
    complete = [name for name, verdict in checkpoint_status(root) if verdict == "complete"]
    return Path(root) / max(complete, key=lambda n: int(n[5:])) if complete else None


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                    checksums: bool = True) -> dict:
    """Load checkpoint ``path`` into ``model`` and ``optimizer``, resharding if needed; collective.

    Any world size loads any checkpoint (DCP reshards). This rank's RNG states are restored when
    the world size is the one that saved, else reseeded from (step, rank). Returns ``{"step",
    "meta", "saved_world", "rng": "restored" | "reseeded"}``. Raises :class:`CheckpointError`
    before touching the model when the checkpoint is incomplete, corrupted, asks the unpickler for
    anything but DCP's metadata classes, or was saved for a model of another shape.
    """
    path = Path(path)
    manifest = verify_checkpoint(path, checksums=checksums)
    rank, world = _rank_world()
    try:
        with open(path / ".metadata", "rb") as f:
            read_metadata(f)  # refuse before DCP (which reads it again, the same safe way)
    except UnsafeCheckpointError as exc:
        raise CheckpointError(f"{path.name}: {exc}") from None
    except Exception as exc:  # a garbage pickle can raise almost anything
        raise CheckpointError(f"{path.name}: unreadable .metadata ({type(exc).__name__}: {exc})"
                              ) from None
    mine, saved = _shapes(get_state_dict(model, optimizer)[0]), manifest["model_shapes"]
    for key in sorted(set(mine) | set(saved)):
        if mine.get(key) != saved.get(key):
            raise CheckpointError(f"{path.name}: foreign checkpoint: parameter {key!r} has shape "
                                  f"{saved.get(key)} in the checkpoint but {mine.get(key)} in "
                                  "the model")
    if manifest["optimizer"] != type(optimizer).__name__:
        raise CheckpointError(f"{path.name}: foreign checkpoint: optimizer "
                              f"{manifest['optimizer']}, expected {type(optimizer).__name__}")
    load_committed(path, model, optimizer)  # commit.py: DCP, resharding, no code run
    if manifest["world_size"] == world:
        extra = torch.load(path / f"rank{rank}.pt", weights_only=True)
        torch.set_rng_state(extra["torch_rng"])
        random.setstate(_as_state(extra["python_rng"]))
    else:  # 2 saved streams cannot become 4: a fresh, reproducible stream per rank
        torch.manual_seed(manifest["step"] * 1_000_003 + rank)
        random.seed(manifest["step"] * 1_000_003 + rank)
    return {"step": manifest["step"], "meta": manifest["meta"],
            "saved_world": manifest["world_size"],
            "rng": "restored" if manifest["world_size"] == world else "reseeded"}


def _as_state(value: Any) -> tuple:
    """``random.getstate()`` comes back from torch.load with lists where tuples were."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in value)
