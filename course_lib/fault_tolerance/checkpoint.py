"""Sharded checkpoints that are either complete or ignored: save, pick the latest, resume.

Chapter 06. Each rank of an FSDP2 model writes only its own shards with DCP
(:mod:`torch.distributed.checkpoint`), plus its RNG states, into a fresh ``step_00000s.tmp``;
after a barrier rank 0 writes ``manifest.json`` (step, world size, shapes, every file's size and
SHA-256) last and renames the folder (:mod:`course_lib.fault_tolerance.commit`). Loading
reshards (saved by 2 ranks, loaded by 4 or 1); RNG states are restored only at the same world
size. A checkpoint is data, never code, and reading one reaches nothing outside its folder
(:mod:`course_lib.fault_tolerance.checkpoint_safe`); ``load_checkpoint`` checks all it can
before touching the model and puts it back if reading the shards fails. The layout on disk and
the trust boundary in full: docs/decisions.md (fault_tolerance/checkpoint.py).
"""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import stat
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                     set_state_dict)

from course_lib.common.checks import is_int
from course_lib.fault_tolerance.checkpoint_safe import UnsafeCheckpointError, read_metadata
from course_lib.fault_tolerance.commit import publish, save_sharded, write_atomic
from course_lib.fault_tolerance.checkpoint_safe import SafeLoadPlanner, SafeReader
from course_lib.fault_tolerance.manifest import (FORMAT, MANIFEST, CheckpointError,
                                                 checkpoint_name, checkpoint_status,
                                                 complete_checkpoints, file_sha256,
                                                 latest_checkpoint, log, pin_checkpoint,
                                                 verify_checkpoint)
from course_lib.fault_tolerance.safe_files import (PinnedFolder, validate_record, label,
                                                   read_in_folder)

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "resume_latest", "checkpoint_status", "verify_checkpoint", "checkpoint_name",
           "MANIFEST", "FORMAT"]


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _shapes(model_sd: dict) -> dict[str, list[int]]:
    """Global shape of every model tensor (a DTensor shard reports the full shape)."""
    return {k: list(v.shape) for k, v in model_sd.items() if isinstance(v, torch.Tensor)}


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


def _rank_state(path: PinnedFolder, rank: int) -> dict:
    """This rank's saved RNG states, read as data and checked before anything is set."""
    data = read_in_folder(path, f"rank{rank}.pt", 1 << 20)
    validate_record(data, f"rank{rank}.pt", f"rank{rank}.pt")
    try:
        extra = torch.load(io.BytesIO(data), weights_only=True)
        torch_rng, python_rng = extra["torch_rng"], _as_state(extra["python_rng"])
        random.Random().setstate(python_rng)  # a scratch generator: raises if malformed
        ok = (type(torch_rng) is torch.Tensor and torch_rng.dtype == torch.uint8
              and torch_rng.shape == torch.get_rng_state().shape)
    except Exception:
        ok = False
    if not ok:
        raise UnsafeCheckpointError(f"rank{rank}.pt holds no RNG states of this torch")
    return {"torch_rng": torch_rng, "python_rng": python_rng}


def _verified(path: PinnedFolder, model: nn.Module, optimizer: torch.optim.Optimizer, checksums: bool,
              check_meta: Callable[[dict], None] | None) -> tuple[dict, dict | None]:
    """Every check that needs no collective: manifest, files, metadata, shapes, RNG, meta."""
    rank, world = _rank_world()
    manifest = verify_checkpoint(path, checksums=checksums)
    try:
        read_metadata(path, manifest["files"])  # refused before DCP reads it (the same way)
        extra = _rank_state(path, rank) if manifest["world_size"] == world else None
    except UnsafeCheckpointError as exc:
        raise CheckpointError(f"{path.name}: {exc}") from None
    mine, saved = _shapes(get_model_state_dict(model)), manifest["model_shapes"]
    for key in sorted(set(mine) | set(saved)):
        if mine.get(key) != saved.get(key):
            raise CheckpointError(f"{path.name}: foreign checkpoint: parameter {label(key)!r} has "
                                  f"shape {saved.get(key)} in the checkpoint but {mine.get(key)} "
                                  "in the model")
    if manifest["optimizer"] != type(optimizer).__name__:
        raise CheckpointError(f"{path.name}: foreign checkpoint: optimizer "
                              f"{label(manifest['optimizer'])}, expected "
                              f"{type(optimizer).__name__}")
    if check_meta is not None:
        try:
            check_meta(manifest)
        except ValueError as exc:
            raise CheckpointError(f"{path.name}: {exc}") from None
    return manifest, extra


def _agree(failure: str | None) -> str | None:
    """Collective: this rank's reason to fail, or a note that another rank has one."""
    if not dist.is_initialized():
        return failure
    device = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([failure is not None], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return failure or ("refused on another rank" if flag.item() else None)


def _same_folder(folder: PinnedFolder | None) -> bool:
    """Collective: did every rank open the same folder (device and inode)? A folder swapped
    between two ranks' opens would otherwise give each rank a different checkpoint."""
    if not dist.is_initialized() or folder is None:
        return True
    device = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor(list(folder.identity), dtype=torch.int64, device=device)
    both = torch.cat([mine, -mine])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return bool(torch.equal(both[:2], mine) and torch.equal(both[2:], -mine))


def _load_pinned(folder: PinnedFolder, files: list[str], model: nn.Module,
                 optimizer: torch.optim.Optimizer) -> None:
    """:func:`~course_lib.fault_tolerance.commit.load_committed` reading through ``folder``'s
    descriptor: DCP, resharding, no code run, no file outside the folder opened once."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=SafeReader(folder, files), planner=SafeLoadPlanner())
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (dict, list, tuple)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        copied = {k: _clone(v) for k, v in items}
        return copied if isinstance(value, dict) else type(value)(copied.values())
    return value


def _reason(exc: BaseException) -> str:
    """What went wrong, in texts written by this package only (a parser's can quote bytes)."""
    inner = [e for e, _ in exc.failures.values()] if isinstance(exc, CheckpointException) else [exc]
    ours = [str(e) for e in inner if isinstance(e, (UnsafeCheckpointError, CheckpointError))]
    return ours[0] if ours else "a shard that torch.load or DCP could not read"


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                    checksums: bool = True, check_meta: Callable[[dict], None] | None = None
                    ) -> dict:
    """Load checkpoint ``path`` into ``model`` and ``optimizer``, resharding if needed; collective.

    Any world size loads any checkpoint (DCP reshards). This rank's RNG states are restored when
    the world size is the one that saved, else reseeded from (step, rank). Returns ``{"step",
    "meta", "saved_world", "rng": "restored" | "reseeded"}``. Raises :class:`CheckpointError` on
    every rank, leaving model and optimizer exactly as they were, when the checkpoint is
    incomplete, corrupted, unsafe (it asks for anything but data inside its folder), saved for a
    model of another shape, or refused by ``check_meta(manifest)`` (which raises ValueError).
    The folder is opened once and every file read relative to that descriptor: replacing it by
    a symlink during the load makes the load refuse or read the original, never another folder.
    """
    path = Path(path)
    rank, world = _rank_world()
    failure, manifest, extra, folder = None, None, None, None
    try:  # opened once: every later read is relative to this descriptor (a swap cannot redirect)
        folder = pin_checkpoint(path)
        manifest, extra = _verified(folder, model, optimizer, checksums, check_meta)
    except CheckpointError as exc:
        failure = str(exc)
    try:
        if (failure := _agree(failure)) is None and not _same_folder(folder):
            failure = "the ranks opened different folders under this name (it was replaced)"
        if failure is not None:
            raise CheckpointError(failure if failure.startswith(path.name) else
                                  f"{path.name}: {failure}")
        saved = _clone(model.state_dict()), _clone(optimizer.state_dict())
        try:
            _load_pinned(folder, list(manifest["files"]), model, optimizer)
        except (KeyboardInterrupt, SystemExit):
            model.load_state_dict(saved[0])
            optimizer.load_state_dict(saved[1])
            raise
        except BaseException as exc:  # noqa: B036 - DCP's CheckpointException is one
            failure = _reason(exc)
        if (failure := _agree(failure)) is not None:  # then every rank puts its state back
            model.load_state_dict(saved[0])
            optimizer.load_state_dict(saved[1])
            raise CheckpointError(f"{path.name}: {failure}; the model and optimizer are "
                                  "unchanged")
    finally:
        if folder is not None:
            folder.close()
    if extra is not None:
        torch.set_rng_state(extra["torch_rng"])
        random.setstate(extra["python_rng"])
    else:  # 2 saved streams cannot become 4: a fresh, reproducible stream per rank
        torch.manual_seed(manifest["step"] * 1_000_003 + rank)
        random.seed(manifest["step"] * 1_000_003 + rank)
    return {"step": manifest["step"], "meta": manifest["meta"],
            "saved_world": manifest["world_size"],
            "rng": "reseeded" if extra is None else "restored"}


def resume_latest(root: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                  check_meta: Callable[[dict], None] | None = None) -> dict | None:
    """Collective: load the newest checkpoint under ``root`` that loads, newest first; log and
    skip each one that does not. Returns :func:`load_checkpoint`'s dict (+ ``"path"``) or None."""
    for path in complete_checkpoints(root):
        try:
            return {"path": path, **load_checkpoint(path, model, optimizer,
                                                    check_meta=check_meta)}
        except CheckpointError as exc:
            log.warning("checkpoint skipped: %s", exc)
    return None


def _as_state(value: Any) -> tuple:
    """``random.getstate()`` comes back from torch.load with lists where tuples were."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in value)
