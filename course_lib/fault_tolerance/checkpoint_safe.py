"""Read a DCP checkpoint as data: nothing in its folder runs code or reaches outside the folder.

torch's own :class:`~torch.distributed.checkpoint.FileSystemReader` and
:class:`~torch.distributed.checkpoint.DefaultLoadPlanner` trust the checkpoint (plain ``pickle``,
any path, ``torch.load(weights_only=False)``: docs/decisions/checkpoints.md, "Why the checkpoint
loader refuses what it refuses"); :class:`SafeReader` and
:class:`SafeLoadPlanner` subclass them with limits. ``.metadata`` is read by
:mod:`course_lib.fault_tolerance.metadata_check` (a restricted unpickler, every field checked,
the work bounded before any tensor is read). Files and records obey
:mod:`course_lib.fault_tolerance.safe_files`: plain names, no symlink, ranges inside the real
file, stored ``torch.save`` records only, bytes items plain data.
"""
from __future__ import annotations

import io
import os
from typing import Any, Iterable

from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner uses

from course_lib.common.deprecation import renamed
from course_lib.fault_tolerance.safe_files import (PinnedFolder, UnsafeCheckpointError,
                                                   validate_record, label, load_plain,
                                                   open_in_folder)

from course_lib.fault_tolerance.metadata_check import (  # noqa: F401 - re-exported
    ALLOWED, MetadataUnpickler, _past_end, read_metadata, validate_metadata)

__all__ = ["UnsafeCheckpointError", "MetadataUnpickler", "SafeReader", "SafeLoadPlanner",
           "ALLOWED", "read_metadata", "validate_metadata"]
__getattr__ = renamed(__name__, {"check_metadata": "validate_metadata"})  # before issue 32


class _FolderFS(FileSystem):
    """DCP's file system, opening only regular files directly inside one folder."""

    def __init__(self, folder: str | os.PathLike | PinnedFolder):
        self.pinned = folder if isinstance(folder, PinnedFolder) else None
        self.folder = folder.path if self.pinned else os.path.abspath(folder)

    def create_stream(self, path, mode):  # DCP calls it as a context manager
        if mode != "rb" or os.path.dirname(os.path.abspath(path)) != self.folder:
            raise UnsafeCheckpointError("refusing to open a file outside the checkpoint")
        return os.fdopen(open_in_folder(self.pinned or self.folder, os.path.basename(path)),
                         "rb")


class SafeReader(FileSystemReader):
    """:class:`FileSystemReader` confined to its folder (module docstring), ``files`` listed;
    given a :class:`PinnedFolder`, every file is opened relative to its descriptor."""

    def __init__(self, path: str | os.PathLike | PinnedFolder,
                 files: Iterable[str] | None = None) -> None:
        super().__init__(path.path if isinstance(path, PinnedFolder) else path)
        self.fs, self.files, self._labels = _FolderFS(path), files, {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise UnsafeCheckpointError("per-rank .metadata files are not read")
        metadata = read_metadata(self.fs.pinned or self.path, self.files)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, *args, **kwargs)
        self._labels = {id(info): f"item {label(index.fqn)}"
                        for index, info in metadata.storage_data.items()}

    def _slice_file(self, file, sinfo: _StorageInfo) -> io.BytesIO:
        what = self._labels.get(id(sinfo), "an item")
        _past_end(what, sinfo, os.fstat(file.fileno()).st_size)  # the file may have shrunk
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)  # read once: what is checked is what torch.load sees
        if len(data) != sinfo.length:
            raise UnsafeCheckpointError(f"{what}: {sinfo.relative_path} shrank while read")
        validate_record(data, what, sinfo.relative_path)
        return io.BytesIO(data)


class SafeLoadPlanner(DefaultLoadPlanner):
    """:class:`DefaultLoadPlanner` whose bytes items load as plain data (:func:`load_plain`)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        obj = load_plain(value.read(), f"item {label(fqn)}", self.state_dict.get(fqn))
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj
