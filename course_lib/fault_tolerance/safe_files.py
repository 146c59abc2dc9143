"""Bytes from a checkpoint folder as data: which files may be opened, which records may be read.

Used by :mod:`course_lib.fault_tolerance.checkpoint_safe` (DCP's reader) and
:mod:`course_lib.fault_tolerance.manifest`. A checkpoint file is a plain name directly inside
its folder, a regular file opened with ``O_NOFOLLOW`` (a symlink is refused, never followed); a
record (what ``torch.save`` wrote for one item) is read into memory once, bounded by the file,
and must be a zip archive of *stored* records that fit inside it before ``torch.load`` sees it
(a deflated record can expand a thousandfold); a bytes item unpickles with no globals at all.
A load opens its folder once (:class:`PinnedFolder`) and every file relative to that descriptor.
Refusals are :class:`UnsafeCheckpointError` with texts written here, never a parser's message:
those can quote bytes of the file (``Unsupported operand 65`` is the byte ``A``).
"""
from __future__ import annotations

import io
import os
import pickle
import re
import stat
import zipfile
from typing import Any

import torch

from course_lib.common.deprecation import renamed

__all__ = ["UnsafeCheckpointError", "label", "plain_name", "PinnedFolder", "open_in_folder",
           "read_in_folder",
           "validate_record", "load_plain"]

_SAFE_TEXT = re.compile(r"[\w./:\-]{1,200}")


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint asks for more than data in its own folder, or is malformed."""


def label(text: Any) -> str:
    """``text`` if it is a short plain name (safe to show), else a neutral stand-in."""
    return text if isinstance(text, str) and _SAFE_TEXT.fullmatch(text) else "<unprintable>"


def plain_name(name: Any) -> bool:
    """A file name without a directory part: no ``/``, not ``.`` or ``..``, no NUL."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and name not in (".", "..")
            and "/" not in name and "\0" not in name)


class PinnedFolder:
    """A folder opened once (``O_DIRECTORY | O_NOFOLLOW``); every file is then opened relative to
    that descriptor (``dir_fd``), so renaming the folder or swapping a symlink in its place
    during a load cannot redirect a read to another folder: the reads stay on this inode.
    The last path component must be a real directory (a symlink is refused, never followed)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.abspath(path)
        self.name = os.path.basename(self.path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                              | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise UnsafeCheckpointError(f"{label(self.name)}: no such checkpoint directory"
                                        ) from None
        except OSError:  # ELOOP (a symlink), ENOTDIR (a file), EACCES
            why = ("not a directory (a symbolic link is not followed)"
                   if os.path.islink(self.path) or not os.path.isdir(self.path)
                   else "cannot be opened")
            raise UnsafeCheckpointError(f"{label(self.name)}: {why}") from None
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)

    def lstat(self, name: str) -> os.stat_result:
        """``lstat`` of ``name`` inside this folder (FileNotFoundError if absent)."""
        if not plain_name(name):
            raise UnsafeCheckpointError("a file name that is not a plain name in the folder")
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def listdir(self) -> list[str]:
        return os.listdir(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "PinnedFolder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_in_folder(folder: "str | os.PathLike | PinnedFolder", name: str) -> int:
    """File descriptor of regular file ``name`` directly inside ``folder``, never a symlink;
    relative to the folder's descriptor when ``folder`` is a :class:`PinnedFolder`."""
    if not plain_name(name):
        raise UnsafeCheckpointError("a file name that is not a plain name in the folder")
    pinned = isinstance(folder, PinnedFolder)
    path = os.path.join(folder.path if pinned else folder, name)
    try:  # O_NOFOLLOW: a symlink fails (ELOOP); O_NONBLOCK: a FIFO cannot block the open
        fd = os.open(name, _FLAGS, dir_fd=folder.fd) if pinned else os.open(path, _FLAGS)
    except FileNotFoundError:
        raise UnsafeCheckpointError(f"{label(name)} is missing") from None
    except OSError:
        link = (stat.S_ISLNK(folder.lstat(name).st_mode) if pinned else os.path.islink(path))
        why = "is a symbolic link" if link else "cannot be opened"
        raise UnsafeCheckpointError(f"{label(name)} {why}") from None
    inside = pinned or os.path.join(os.path.realpath(folder), name) == os.path.realpath(path)
    if not stat.S_ISREG(os.fstat(fd).st_mode) or not inside:
        os.close(fd)
        raise UnsafeCheckpointError(f"{label(name)} is not a regular file in the folder")
    return fd


def read_in_folder(folder: "str | os.PathLike | PinnedFolder", name: str, limit: int) -> bytes:
    """All bytes of ``name`` (see :func:`open_in_folder`), refused beyond ``limit`` bytes."""
    with os.fdopen(open_in_folder(folder, name), "rb") as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise UnsafeCheckpointError(f"{label(name)} is larger than {limit} bytes")
        return f.read(limit + 1)


def validate_record(data: bytes, what: str, fname: str) -> None:
    """``data`` must be a ``torch.save`` archive whose records are stored (not compressed) and
    fit inside it: checked with Python's zipfile and torch's own reader, which must agree."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
        reader = torch._C.PyTorchFileReader(io.BytesIO(data))
        records = {n: (reader.get_record_offset(n), reader.get_record_size(n))
                   for n in reader.get_all_records()}
    except Exception:
        raise UnsafeCheckpointError(f"{what}: not a torch.save record in {fname}") from None
    if any(i.compress_type != zipfile.ZIP_STORED or i.compress_size != i.file_size
           for i in infos):
        raise UnsafeCheckpointError(f"{what}: a compressed record in {fname} (refused: it "
                                    "could expand to far more memory than the file holds)")
    ours = {i.filename.split("/", 1)[-1]: i.file_size for i in infos}
    if (ours != {n: size for n, (_, size) in records.items()}
            or any(offset + size > len(data) for offset, size in records.values())
            or sum(ours.values()) > len(data)):
        raise UnsafeCheckpointError(f"{what}: a malformed torch.save record in {fname}")


__getattr__ = renamed(__name__, {"check_record": "validate_record"})  # before issue 32


class _PlainUnpickler(pickle.Unpickler):
    """No globals, no persistent ids: numbers, strings, bytes, lists, tuples, dicts, sets."""

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeCheckpointError("not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError("not plain data")


def _kind(value: Any) -> str:
    for kinds, name in ((bool, "bool"), ((int, float), "number"), (str, "string"),
                        ((list, tuple), "sequence"), (dict, "mapping")):
        if isinstance(value, kinds):
            return name
    return type(value).__name__


def load_plain(data: bytes, what: str, dest: Any = None) -> Any:
    """The plain value a bytes item holds, of the same kind as ``dest`` (unless one is None)."""
    validate_record(data, what, "a bytes item")
    try:
        pkl = torch._C.PyTorchFileReader(io.BytesIO(data)).get_record("data.pkl")
        value = _PlainUnpickler(io.BytesIO(pkl)).load()
    except UnsafeCheckpointError:
        raise UnsafeCheckpointError(f"{what}: a bytes item holds something other than plain "
                                    "data (only numbers, strings and containers load)") from None
    except Exception:
        raise UnsafeCheckpointError(f"{what}: an unreadable bytes item") from None
    if dest is not None and value is not None and _kind(value) != _kind(dest):
        raise UnsafeCheckpointError(f"{what}: holds a {_kind(value)} where the model has a "
                                    f"{_kind(dest)}")
    return value
