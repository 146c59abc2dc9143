"""Loading a sharded checkpoint (chapter 06): check everything first, then touch the model.

:func:`load_checkpoint` pins the folder (opened once, every file read relative to it), checks the
manifest, sizes, SHA-256 and DCP's metadata on every rank, agrees across ranks, and only then
loads the shards (resharding to any world size; RNG states only at the same world size); if
reading fails, model and optimizer are put back. :func:`resume_latest` loads the newest complete
checkpoint under a root. Saving: :mod:`course_lib.fault_tolerance.checkpoint`.
"""
from __future__ import annotations

import copy
import io
import random
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                     set_state_dict)

from course_lib.fault_tolerance.checkpoint_safe import UnsafeCheckpointError, read_metadata
from course_lib.fault_tolerance.checkpoint_safe import SafeLoadPlanner, SafeReader
from course_lib.fault_tolerance.manifest import (CheckpointError, complete_checkpoints, log,
                                                 pin_checkpoint, verify_checkpoint)
from course_lib.fault_tolerance.safe_files import (PinnedFolder, validate_record, label,
                                                   read_in_folder)


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _shapes(model_sd: dict) -> dict[str, list[int]]:
    """Global shape of every model tensor (a DTensor shard reports the full shape)."""
    return {k: list(v.shape) for k, v in model_sd.items() if isinstance(v, torch.Tensor)}


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
        saved = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
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
