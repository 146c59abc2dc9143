"""DCP's ``.metadata`` loads whichever way the interpreter pickled its Enum member (issue 57).

``TensorProperties`` pickles its memory format as a ``_MEM_FORMAT_ENCODING`` member. Python 3.11.7
writes it by value, ``_MEM_FORMAT_ENCODING(0)``; Debian 12's Python 3.11.2 writes it by name,
``getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")`` (a REDUCE of ``builtins.getattr``).
The safe loader accepts that ``getattr`` for a member of an allowed Enum and nothing else: any
other ``getattr`` is refused with the loader's usual error, naming what was asked for.
Hand-assembled pickles show both forms and the attacks; a real checkpoint is rewritten in the
3.11.2 form; ``test_cross_python`` saves and loads across two real interpreters.
"""
from __future__ import annotations

import enum
import io
import pickle

import pytest
import torch
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

from ckpt_attacks import tamper
from course_lib.fault_tolerance.checkpoint import CheckpointError, load_checkpoint
from course_lib.fault_tolerance.metadata_check import (ALLOWED, MetadataUnpickler,
                                                       UnsafeCheckpointError, validate_metadata)
from course_lib.fault_tolerance.training import build

MD = "torch.distributed.checkpoint.metadata"
REFUSED = (r"refusing to load: \.metadata asks for builtins\.getattr\({what}\), which is not "
           r"part of DCP's metadata \(a tampered or foreign checkpoint could run code this way\)")


def _str(text: str) -> bytes:
    data = text.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(data)]) + data


def _global(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + pickle.STACK_GLOBAL


def _protocol4(*ops: bytes) -> bytes:
    return pickle.PROTO + b"\x04" + b"".join(ops) + pickle.STOP


def _getattr(target: bytes, name: bytes) -> bytes:
    """``getattr(target, name)`` as Python 3.11.2 pickles an Enum member (protocol 4)."""
    return _protocol4(_global("builtins", "getattr"), target, name, pickle.TUPLE2, pickle.REDUCE)


def _load(data: bytes):
    return MetadataUnpickler(io.BytesIO(data)).load()


ENUM = _global(MD, "_MEM_FORMAT_ENCODING")


def test_a_member_loads_by_value_and_by_name():
    by_value = _protocol4(ENUM, pickle.BININT1 + b"\x01", pickle.TUPLE1, pickle.REDUCE)
    by_name = _getattr(ENUM, _str("TORCH_CHANNELS_LAST"))
    assert _load(by_value) is _load(by_name) is _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST


def _pickled(obj, member) -> bytes:
    """``obj`` pickled (protocol 4) with every Enum member written as ``member(it)`` returns."""
    class Pickler(pickle.Pickler):
        def reducer_override(self, o):
            return member(o) if isinstance(o, enum.Enum) else NotImplemented

    buf = io.BytesIO()
    Pickler(buf, protocol=4).dump(obj)
    return buf.getvalue()


def _by_name(obj, attr=None) -> bytes:
    """As Python 3.11.2 writes an Enum member: ``getattr(cls, name)`` (``attr``: an attacker's
    other attribute of the same class)."""
    return _pickled(obj, lambda o: (getattr, (type(o), attr or o.name)))


def _by_value(obj) -> bytes:
    """As Python 3.11.7, 3.10, 3.12, 3.13 write an Enum member: ``cls(value)``."""
    return _pickled(obj, lambda o: (type(o), (o.value,)))


def test_real_metadata_loads_in_both_forms(saved_ckpt):
    metadata = pickle.loads((saved_ckpt / ".metadata").read_bytes())  # our own file
    by_name, by_value = _by_name(metadata), _by_value(metadata)
    assert b"getattr" in by_name and b"getattr" not in by_value  # whichever Python runs this
    for data in (by_value, by_name):
        loaded = validate_metadata(_load(data))
        props = [item.properties for item in loaded.state_dict_metadata.values()
                 if hasattr(item, "properties")]
        assert props and all(p.memory_format == torch.contiguous_format for p in props)
        assert loaded.state_dict_metadata == metadata.state_dict_metadata


def test_a_checkpoint_written_in_the_by_name_form_loads(ckpt, saved_ckpt):
    metadata = pickle.loads((ckpt / ".metadata").read_bytes())
    tamper(ckpt, ".metadata", _by_name(metadata))  # what Debian's python3 writes
    model, optimizer = build("tiny", seed=1)
    reference, ref_opt = build("tiny", seed=1)
    before = model.tok_emb.weight.detach().clone()
    load_checkpoint(ckpt, model, optimizer)
    assert not torch.equal(model.tok_emb.weight, before)
    load_checkpoint(saved_ckpt, reference, ref_opt)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                reference.state_dict().values()))


ATTACKS = {  # (getattr's object, its name) -> what the error names
    "a name no member has": (ENUM, _str("NOT_A_MEMBER"), f"{MD}._MEM_FORMAT_ENCODING, "
                                                         "NOT_A_MEMBER"),
    "a dunder of the enum": (ENUM, _str("__class__"), f"{MD}._MEM_FORMAT_ENCODING, __class__"),
    "a method of the enum": (ENUM, _str("__reduce_ex__"), "_MEM_FORMAT_ENCODING, __reduce_ex__"),
    "an attribute of the enum": (ENUM, _str("_member_map_"), "_MEM_FORMAT_ENCODING, _member_map_"),
    "a name that is no string": (ENUM, pickle.BININT1 + b"\x00", "_MEM_FORMAT_ENCODING, a int"),
    "an allowed class, not an enum": (_global("pathlib", "PosixPath"), _str("write_text"),
                                      "pathlib.PosixPath, write_text"),
    "DCP's dataclass": (_global(MD, "Metadata"), _str("__init__"), f"{MD}.Metadata, __init__"),
    "a builtin class": (_global("builtins", "set"), _str("mro"), "builtins.set, mro"),
    "torch.Size": (_global("torch", "Size"), _str("__new__"), "torch.Size, __new__"),
    "a dtype object": (_global("torch", "float32"), _str("to_complex"), "a dtype, to_complex"),
    "a string": (_str("os"), _str("system"), "a str, system"),
    "a member, not its class": (ENUM + pickle.BININT1 + b"\x00" + pickle.TUPLE1 + pickle.REDUCE,
                                _str("name"), "a _MEM_FORMAT_ENCODING, name"),
    "getattr itself": (_global("builtins", "getattr"), _str("__call__"),
                       "metadata_check.enum_member, __call__"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_every_other_getattr_is_refused_naming_it(attack):
    target, name, what = ATTACKS[attack]
    with pytest.raises(UnsafeCheckpointError, match=REFUSED.format(what=".*" + what)):
        _load(_getattr(target, name))


def test_getattr_in_a_real_checkpoint_is_refused_before_any_tensor_is_read(ckpt):
    metadata = pickle.loads((ckpt / ".metadata").read_bytes())
    tamper(ckpt, ".metadata", _by_name(metadata, attr="__class__"))
    model, optimizer = build("tiny")
    before = model.tok_emb.weight.detach().clone()
    with pytest.raises(CheckpointError, match=REFUSED.format(what=".*_MEM_FORMAT_ENCODING, "
                                                                  "__class__")):
        load_checkpoint(ckpt, model, optimizer)
    assert torch.equal(model.tok_emb.weight, before)


def test_every_enum_the_loader_allows_may_come_by_name():
    from course_lib.fault_tolerance.metadata_check import _ENUMS
    allowed = [getattr(__import__(module, fromlist=[name]), name)
               for module, names in ALLOWED.items() for name in names]
    enums = {cls for cls in allowed if isinstance(cls, type) and issubclass(cls, enum.Enum)}
    assert enums == set(_ENUMS) == {_MEM_FORMAT_ENCODING}
