"""Read a DCP checkpoint without running code from it: the trust boundary of chapter 6.

torch 2.13's :class:`~torch.distributed.checkpoint.FileSystemReader` reads ``.metadata`` with a
plain ``pickle.load`` and :class:`~torch.distributed.checkpoint.DefaultLoadPlanner` loads every
non-tensor item (e.g. the optimizer's ``param_groups``) with ``torch.load(weights_only=False)``:
a checkpoint directory written by someone else can run any code on the machine that loads it.
Checksums in a manifest do not help against whoever can rewrite the manifest too.

Here the same reader and planner are used with two changes:

* ``.metadata`` goes through :class:`MetadataUnpickler`, which resolves only the classes DCP's
  own metadata is made of (listed in :data:`ALLOWED`, read off torch 2.13's ``metadata.py`` and
  ``filesystem.py``), ``torch.Size``, torch dtypes/layouts, paths and plain containers; any other
  global (``os.system``, ``builtins.eval``, ...) raises :class:`UnsafeCheckpointError` before it
  is called;
* non-tensor items load with ``torch.load(weights_only=True)`` (numbers, strings, lists, dicts).

Tensor data was already loaded with ``weights_only=True`` by torch. What this does *not* protect
against: a checkpoint that is well-formed but holds wrong numbers (the manifest's checksums catch
accidents, not an attacker), or huge sizes meant to exhaust memory. Load checkpoints you or your
own jobs wrote; treat any other directory as untrusted input.
"""
from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner uses

__all__ = ["UnsafeCheckpointError", "MetadataUnpickler", "SafeReader", "SafeLoadPlanner",
           "ALLOWED", "read_metadata"]

_MD, _FS = "torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"
ALLOWED: dict[str, frozenset[str]] = {
    _MD: frozenset({"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                    "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                    "_MEM_FORMAT_ENCODING"}),
    _FS: frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),                  # + every torch.<dtype>, checked by type below
    "torch.serialization": frozenset({"_get_layout"}),  # a lookup in a table of torch.layout
    "pathlib": frozenset({"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset"}),
}


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint's metadata names something other than DCP's own plain data classes."""


class MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`ALLOWED` globals (and torch dtypes)."""

    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"refusing to load: .metadata asks for {module}.{name}, which is not part of DCP's "
            "metadata (a tampered or foreign checkpoint could run code this way)")


def read_metadata(stream: io.BufferedIOBase) -> Metadata:
    """Unpickle DCP metadata from ``stream`` with :class:`MetadataUnpickler`."""
    metadata = MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"refusing to load: .metadata holds a "
                                    f"{type(metadata).__name__}, not DCP Metadata")
    return metadata


class SafeReader(FileSystemReader):
    """:class:`FileSystemReader` whose ``.metadata`` goes through :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_metadata(stream)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """:class:`DefaultLoadPlanner` that loads non-tensor items with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
