"""DCP's ``.metadata`` read as data (chapter 06): a restricted unpickler, then every field checked.

:class:`MetadataUnpickler` resolves only :data:`ALLOWED` names (``builtins.getattr`` only as
:func:`enum_member`: a member of DCP's Enum by name, as Python 3.11.2 pickles it) and builds
only DCP's own dataclasses; :func:`validate_metadata` checks each field's type and bounds the
work (pickle opcodes, seconds, chunks per tensor and in all, no chunk or byte range listed
twice) before any tensor is read; :func:`read_metadata` does both on a pinned folder. Used by
:mod:`course_lib.fault_tolerance.checkpoint_safe`.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import math
import os
import pickle
import re
import time
from typing import Any, Iterable

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, MetadataIndex, StorageMeta,
                                                   TensorProperties, TensorStorageMetadata,
                                                   _MEM_FORMAT_ENCODING)

from course_lib.common.deprecation import renamed
from course_lib.fault_tolerance.safe_files import (PinnedFolder, UnsafeCheckpointError,
                                                   label,
                                                   open_in_folder, read_in_folder)

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
_DCP_CLASSES = frozenset({Metadata, MetadataIndex, StorageMeta, TensorProperties,
                          TensorStorageMetadata, BytesStorageMetadata, ChunkStorageMetadata,
                          _StorageInfo})
_ENUMS = (_MEM_FORMAT_ENCODING,)  # the Enum classes among ALLOWED: a member may come by name
_DATA_FILE = re.compile(r"__\d+_\d+\.distcp")
MAX_METADATA_BYTES = 16 << 20  # the medium GPT: 77 kB; objects can be ~60x the bytes
# The work .metadata may ask for, bounded before any tensor is read (a chunk list repeated 10^6
# times through the pickle's memo is 2 MB of file and took 201 s and 940 MB to load):
MAX_CHUNKS_PER_TENSOR = 4096     # one chunk per saving rank (more with TP x FSDP)
MAX_CHUNKS = 1 << 17             # all tensors' chunks, and storage records, together
MAX_PICKLE_OPS = 4_000_000       # opcodes: the medium GPT's .metadata has ~10^4
MAX_METADATA_SECONDS = 5.0       # unpickling and checking, on the slowest machine we know


def _qualname(obj: Any) -> str:
    if isinstance(obj, type) or callable(obj):
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"
    return f"a {type(obj).__name__}"


def _refused(what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"refusing to load: .metadata asks for {what}, which is not part of DCP's metadata "
        "(a tampered or foreign checkpoint could run code this way)")


def enum_member(cls: Any, name: Any) -> enum.Enum:
    """What ``builtins.getattr`` means in ``.metadata``: a member of one of DCP's Enum classes
    by name, as Python 3.11.2 pickles it (``getattr(_MEM_FORMAT_ENCODING, "TORCH_..._FORMAT")``;
    3.11.7 writes ``_MEM_FORMAT_ENCODING(0)``). Any other attribute of anything is refused."""
    if any(cls is e for e in _ENUMS) and type(name) is str and name in cls.__members__:
        return cls.__members__[name]
    shown = label(name) if type(name) is str else f"a {type(name).__name__}"
    raise _refused(f"builtins.getattr({_qualname(cls)}, {shown})")


class MetadataUnpickler(pickle._Unpickler):  # the pure-Python machine: its opcodes can be checked
    """Unpickler of DCP's ``.metadata``: :data:`ALLOWED` names only, builds DCP's classes only."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, *, deadline: float | None = None) -> None:
        super().__init__(file)
        self._ops, self._deadline = 0, deadline

    def _tick(self) -> None:
        """Every 4096 opcodes: refuse past the opcode budget or the time limit."""
        if self._ops > MAX_PICKLE_OPS:
            raise UnsafeCheckpointError(f"refusing to load: .metadata takes more than "
                                        f"{MAX_PICKLE_OPS} pickle operations")
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise UnsafeCheckpointError(f"refusing to load: reading .metadata took more than "
                                        f"{MAX_METADATA_SECONDS:g} s")

    def _grown(self, container: Any) -> None:
        if isinstance(container, list) and len(container) > MAX_CHUNKS_PER_TENSOR:
            raise UnsafeCheckpointError(f"refusing to load: .metadata holds a list of more than "
                                        f"{MAX_CHUNKS_PER_TENSOR} items (chunks per tensor)")
        if isinstance(container, (dict, set)) and len(container) > MAX_CHUNKS:
            raise UnsafeCheckpointError(f"refusing to load: .metadata holds a table of more than "
                                        f"{MAX_CHUNKS} entries")

    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == ("builtins", "getattr"):  # an Enum member by name: checked when
            return enum_member                          # REDUCE calls it with its arguments
        raise _refused(f"{label(module)}.{label(name)}")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError("refusing to load: .metadata holds a persistent reference")

    def _build(self) -> None:  # BUILD: set the state of the object below the top of the stack
        inst, state = self.stack[-2], self.stack[-1]
        if type(inst) not in _DCP_CLASSES:
            raise UnsafeCheckpointError(f"refusing to load: .metadata sets attributes of "
                                        f"{_qualname(inst)}, not of DCP metadata")
        names = {f.name for f in dataclasses.fields(inst)}
        ok = (isinstance(state, tuple) and len(state) == 5 if type(inst) is TensorProperties
              else type(state) is dict and set(state) <= names)
        if not ok:
            raise UnsafeCheckpointError(f"refusing to load: .metadata gives a "
                                        f"{type(inst).__name__} a state it cannot have")
        pickle._Unpickler.load_build(self)

    def _newobj(self) -> None:  # NEWOBJ: cls.__new__(cls, *args), only for DCP's dataclasses
        if self.stack[-2] not in _DCP_CLASSES or self.stack[-1] != ():
            raise UnsafeCheckpointError(f"refusing to load: .metadata creates "
                                        f"{_qualname(self.stack[-2])} without calling it")
        pickle._Unpickler.load_newobj(self)

    def _refuse(self) -> None:
        raise UnsafeCheckpointError("refusing to load: .metadata uses an opcode DCP never writes")

    dispatch[pickle.BUILD[0]] = _build
    dispatch[pickle.NEWOBJ[0]] = _newobj
    for _op in (pickle.INST, pickle.OBJ, pickle.NEWOBJ_EX, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_op[0]] = _refuse
    del _op
    _GROWS = frozenset(op[0] for op in (pickle.APPEND, pickle.APPENDS, pickle.SETITEM,
                                        pickle.SETITEMS, pickle.ADDITEMS))

    def _counted(handler: Any, grows: bool) -> Any:  # noqa: N805 - run at class creation
        def run(self: "MetadataUnpickler") -> None:
            self._ops += 1
            if not self._ops & 4095:
                self._tick()
            handler(self)
            if grows:
                self._grown(self.stack[-1])
        return run

    for _op, _handler in list(dispatch.items()):
        dispatch[_op] = _counted(_handler, _op in _GROWS)
    del _counted, _op, _handler


def _size(value: Any, dims: int | None = None) -> bool:
    return (type(value) is torch.Size and (dims is None or len(value) == dims)
            and all(type(n) is int and n >= 0 for n in value))


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise UnsafeCheckpointError(f".metadata: {what}")


def validate_metadata(md: Any) -> Metadata:
    """``md`` if every field has the type DCP gives it (and item ranges are plain), else raise."""
    _check(type(md) is Metadata, "it holds no DCP Metadata")
    _check(type(md.state_dict_metadata) is dict, "state_dict_metadata is not a dict")
    chunks = 0
    for fqn, item in md.state_dict_metadata.items():
        what = f"entry {label(fqn)}"
        _check(type(fqn) is str and type(item) in (TensorStorageMetadata, BytesStorageMetadata),
               f"{what} is neither a tensor nor bytes")
        if type(item) is TensorStorageMetadata:
            p = item.properties
            _check(type(p) is TensorProperties and isinstance(p.dtype, torch.dtype)
                   and isinstance(p.layout, torch.layout) and type(p.requires_grad) is bool
                   and type(p.pin_memory) is bool and _size(item.size), f"{what}: bad properties")
            _check(type(item.chunks) is list and all(
                type(c) is ChunkStorageMetadata and _size(c.offsets, len(item.size))
                and _size(c.sizes, len(item.size))
                and all(o + s <= n for o, s, n in zip(c.offsets, c.sizes, item.size))
                for c in item.chunks), f"{what}: a chunk outside its tensor")
            # the work a load does: no more chunks than ranks could write, and no more elements
            # than the tensor has (a chunk listed twice would be read twice)
            chunks += len(item.chunks)
            _check(len(item.chunks) <= MAX_CHUNKS_PER_TENSOR and chunks <= MAX_CHUNKS,
                   f"{what}: more chunks than a checkpoint of up to {MAX_CHUNKS_PER_TENSOR} "
                   f"ranks has ({MAX_CHUNKS} in all)")
            full = [tuple(c.offsets) for c in item.chunks if math.prod(c.sizes)]
            _check(len(set(full)) == len(full)
                   and sum(math.prod(c.sizes) for c in item.chunks) <= math.prod(item.size),
                   f"{what}: chunks that overlap (more elements than the tensor has)")
    _check(type(md.storage_data) is dict and len(md.storage_data) <= MAX_CHUNKS,
           f"storage_data is not a dict of at most {MAX_CHUNKS} records")
    for index, info in md.storage_data.items():
        _check(type(index) is MetadataIndex and type(index.fqn) is str
               and (index.offset is None or _size(index.offset))
               and (index.index is None or type(index.index) is int), "a malformed item index")
        what = f"item {label(index.fqn)}"
        _check(type(info) is _StorageInfo, f"{what} has no storage record")
        _check(type(info.relative_path) is str and _DATA_FILE.fullmatch(info.relative_path),
               f"{what} is stored in something that is not a data file of this checkpoint")
        _check(type(info.offset) is int and type(info.length) is int and info.offset >= 0
               and info.length >= 0, f"{what} has a byte range that is not two natural numbers")
        _check(not info.transform_descriptors, f"{what} is stored through a transform "
               "(compression or encryption), which this reader refuses")
    meta = md.storage_meta
    _check(meta is None or (type(meta) is StorageMeta and type(meta.modules) is list),
           "storage_meta is malformed")
    _check(md.version is None or type(md.version) is str, "version is not a string")
    return md


__getattr__ = renamed(__name__, {"check_metadata": "validate_metadata"})  # before issue 32


def read_metadata(folder: str | os.PathLike | PinnedFolder,
                  files: Iterable[str] | None = None) -> Metadata:
    """``folder/.metadata`` unpickled by :class:`MetadataUnpickler` and checked; every item's
    file must be one of ``files`` (when given) and hold the item's bytes (real sizes). The work
    is bounded (:data:`MAX_PICKLE_OPS`, :data:`MAX_CHUNKS_PER_TENSOR`, :data:`MAX_CHUNKS`,
    :data:`MAX_METADATA_SECONDS`) before any tensor is read."""
    deadline = time.monotonic() + MAX_METADATA_SECONDS
    data = read_in_folder(folder, ".metadata", MAX_METADATA_BYTES)
    try:
        md = MetadataUnpickler(io.BytesIO(data), deadline=deadline).load()
    except UnsafeCheckpointError:
        raise
    except Exception:  # a garbage pickle can raise almost anything, and its text (even its
        # type) depends on the bytes: say only what it is not
        raise UnsafeCheckpointError("unreadable .metadata: not a pickle of DCP metadata"
                                    ) from None
    validate_metadata(md)
    if time.monotonic() > deadline:
        raise UnsafeCheckpointError(f"refusing to load: reading .metadata took more than "
                                    f"{MAX_METADATA_SECONDS:g} s")
    listed, sizes = None if files is None else frozenset(files), {}
    for index, info in md.storage_data.items():
        what, name = f"item {label(index.fqn)}", info.relative_path
        _check(listed is None or name in listed,
               f"{what} is stored in something that is not a data file of this checkpoint")
        if name not in sizes:
            fd = open_in_folder(folder, name)
            sizes[name] = os.fstat(fd).st_size
            os.close(fd)
        _past_end(what, info, sizes[name])
    ranges: dict[str, list[tuple[int, int]]] = {}
    for info in md.storage_data.values():
        ranges.setdefault(info.relative_path, []).append((info.offset, info.length))
    for name, spans in ranges.items():  # every byte is read once at most: no overlapping items
        spans.sort()
        _check(all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:])),
               f"two items share bytes of {label(name)} (a record would be read twice)")
    return md


def _past_end(what: str, info: _StorageInfo, size: int) -> None:
    if info.offset + info.length > size:
        raise UnsafeCheckpointError(f"{what}: bytes {info.offset}-{info.offset + info.length} "
                                    f"are past the end of {info.relative_path} ({size} bytes)")
