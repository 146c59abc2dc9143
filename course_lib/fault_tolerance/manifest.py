"""The manifest of a checkpoint (its commit marker) and the choice of the checkpoint to resume.

Chapter 6. ``manifest.json`` lists step, world size, parameter shapes and every file with its
size and SHA-256 (:mod:`course_lib.fault_tolerance.checkpoint` writes it). Reading it is part of
the trust boundary: the manifest is read as a regular file inside its folder (no symlink), at
most 16 MiB, and every field is checked for its type before it is used, so a malformed one
(``files: []``, an entry without ``bytes``, JSON nested 100,000 deep, a string where an object
belongs) makes *that* folder invalid with a reason, never a crash of the scan.
:func:`complete_checkpoints` skips such folders and logs why (logger
``course_lib.fault_tolerance``): one bad folder never blocks resuming from an older good one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
from pathlib import Path

from course_lib.common.checks import non_negative_int
from course_lib.fault_tolerance.commit import MARKER
from course_lib.fault_tolerance.safe_files import (PinnedFolder, UnsafeCheckpointError, label,
                                                   open_in_folder, plain_name, read_in_folder)

__all__ = ["CheckpointError", "MANIFEST", "FORMAT", "COMMITTED", "checkpoint_name",
           "pin_checkpoint", "read_manifest", "file_sha256", "verify_checkpoint", "checkpoint_status",
           "complete_checkpoints", "latest_checkpoint"]

MANIFEST = MARKER  # the commit marker (commit.py) holds the manifest
FORMAT = "course_lib.checkpoint/1"  # a data format name, not a module path: keep it
MAX_MANIFEST_BYTES = 16 << 20  # a loss history of 100,000 steps: ~2 MB
COMMITTED = re.compile(r"^step_(\d{6,})$")
_SHA256 = re.compile(r"[0-9a-f]{64}")
log = logging.getLogger("course_lib.fault_tolerance")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: incomplete, corrupted, unsafe, or for another model."""


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint taken after ``step`` optimizer steps."""
    non_negative_int(step, "step")
    return f"step_{step:06d}"


def _nat(value) -> bool:
    return type(value) is int and value >= 0


def _schema(m: dict) -> str | None:
    """What is malformed in manifest ``m`` (format and step already checked), or None."""
    files, shapes = m.get("files"), m.get("model_shapes")
    if type(m.get("world_size")) is not int or m["world_size"] < 1:
        return "world_size is not a positive integer"
    if type(m.get("meta")) is not dict:
        return "meta is not an object"
    if type(m.get("optimizer")) is not str:
        return "optimizer is not a string"
    if type(shapes) is not dict or not all(type(s) is list and all(_nat(n) for n in s)
                                           for s in shapes.values()):
        return "model_shapes is not an object of integer lists"
    if type(files) is not dict or not files:
        return "files is not a non-empty object"
    if not all(plain_name(f) and f != MANIFEST for f in files):
        return "files names something that is not a plain file name"
    for info in files.values():
        if type(info) is not dict:
            return "an entry of files is not an object"
        if not _nat(info.get("bytes")):
            return "an entry of files has no integer bytes"
        if not (isinstance(info.get("sha256"), str) and _SHA256.fullmatch(info["sha256"])):
            return "an entry of files has no SHA-256"
    return None if ".metadata" in files else "files does not list .metadata"


def pin_checkpoint(path: str | Path) -> PinnedFolder:
    """Open committed checkpoint folder ``path`` once (:class:`PinnedFolder`); CheckpointError if
    it is not a real directory with a committed name."""
    path = Path(path)
    if COMMITTED.match(path.name) is None:
        if not os.path.lexists(path):
            raise CheckpointError(f"{path.name}: no such checkpoint directory")
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise CheckpointError(f"{path.name}: not a directory (a symbolic link is not "
                                  "followed)")
        raise CheckpointError(f"{path.name}: not a committed checkpoint (an unfinished save "
                              "ends in .tmp and is never loaded)")
    try:
        return PinnedFolder(path)
    except UnsafeCheckpointError as exc:
        raise CheckpointError(str(exc)) from None


def read_manifest(path: str | Path | PinnedFolder) -> dict:
    """The checked manifest of the checkpoint directory ``path``; CheckpointError if unusable."""
    if not isinstance(path, PinnedFolder):
        with pin_checkpoint(path) as folder:
            return read_manifest(folder)
    folder, path = path, Path(path.path)
    match = COMMITTED.match(path.name)
    _lstat(folder, MANIFEST, f"no {MANIFEST} (commit marker): the save did not finish")
    try:
        manifest = json.loads(read_in_folder(folder, MANIFEST, MAX_MANIFEST_BYTES).decode("utf-8"))
    except UnsafeCheckpointError as exc:
        raise CheckpointError(f"{path.name}: {exc}") from None
    except json.JSONDecodeError as exc:  # its message names a position, never the text
        raise CheckpointError(f"{path.name}: {MANIFEST} is not valid JSON ({exc.msg} at line "
                              f"{exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise CheckpointError(f"{path.name}: malformed manifest: nested too deeply") from None
    except ValueError as exc:  # not UTF-8, or an integer with too many digits
        raise CheckpointError(f"{path.name}: {MANIFEST} is not valid JSON "
                              f"({type(exc).__name__})") from None
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != FORMAT:
        shown = repr(label(fmt)) if isinstance(fmt, str) else f"a {type(fmt).__name__}"
        raise CheckpointError(f"{path.name}: foreign checkpoint: manifest format "
                              f"{'missing' if fmt is None else shown}, expected {FORMAT!r}")
    step = manifest.get("step")
    if type(step) is not int or step != int(match.group(1)):
        said = step if type(step) is int else f"a {type(step).__name__}"
        raise CheckpointError(f"{path.name}: manifest mismatch: it says step {said}")
    problem = _schema(manifest)
    if problem:
        raise CheckpointError(f"{path.name}: malformed manifest: {problem}")
    return manifest


def _lstat(folder: PinnedFolder, name: str, missing: str) -> os.stat_result:
    try:
        return folder.lstat(name)
    except FileNotFoundError:
        raise CheckpointError(f"{folder.name}: {missing}") from None
    except OSError:
        raise CheckpointError(f"{folder.name}: {label(name)} cannot be read") from None


def file_sha256(folder: Path | PinnedFolder, name: str) -> str:
    digest = hashlib.sha256()
    with os.fdopen(open_in_folder(folder, name), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(path: str | Path | PinnedFolder, *, checksums: bool = True) -> dict:
    """Return the manifest of committed checkpoint ``path``; raise CheckpointError if unusable.

    Checks: the directory name is a committed one, ``manifest.json`` exists, parses and has
    the right fields (:func:`read_manifest`), every listed file is a regular file (not a
    symlink) with its size (and SHA-256 if ``checksums``), and no file is missing from the list.
    Everything is read relative to the folder opened once (:class:`PinnedFolder`).
    """
    if not isinstance(path, PinnedFolder):
        with pin_checkpoint(path) as folder:
            return verify_checkpoint(folder, checksums=checksums)
    folder, name = path, path.name
    manifest = read_manifest(folder)
    for fname, info in manifest["files"].items():
        shown = label(fname)
        st = _lstat(folder, fname, f"missing file {shown}")
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise CheckpointError(f"{name}: {shown} is {what} (refused, never followed)")
        if st.st_size != info["bytes"]:
            raise CheckpointError(f"{name}: {shown} has {st.st_size} bytes, the "
                                  f"manifest says {info['bytes']} (truncated or overwritten)")
        try:
            if checksums and file_sha256(folder, fname) != info["sha256"]:
                raise CheckpointError(f"{name}: checksum mismatch in {shown} (corrupted)")
        except UnsafeCheckpointError as exc:
            raise CheckpointError(f"{name}: {exc}") from None
    try:
        listed = folder.listdir()
    except OSError:
        raise CheckpointError(f"{name}: cannot be listed") from None
    extra = sorted(label(n) for n in listed if n not in manifest["files"] and n != MANIFEST)
    if extra:
        raise CheckpointError(f"{name}: manifest mismatch: files not in the manifest {extra}")
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


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The committed checkpoints under ``root`` whose manifest and file sizes check out, newest
    first; every other committed-looking folder is logged with the reason it is skipped."""
    done = []
    for name, verdict in checkpoint_status(root):
        if verdict == "complete":
            done.append(Path(root) / name)
        else:  # an unfinished save (.tmp) is normal after a crash; anything else is worth a word
            level = logging.WARNING if COMMITTED.match(name) else logging.INFO
            log.log(level, "checkpoint %s %s", name, verdict)
    return sorted(done, key=lambda p: int(p.name[5:]), reverse=True)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The committed checkpoint with the highest step whose manifest and files check out.

    Directories ending in ``.tmp``, without a marker, with a malformed manifest or with
    missing/short files are skipped and logged (sizes are checked here; checksums when
    loading). ``None`` when there is none.
    """
    done = complete_checkpoints(root)
    return done[0] if done else None
