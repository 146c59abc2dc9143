"""How a rank's return value travels back to :func:`course_lib.run`: few copies of its tensors.

torch pickles a tensor through ``torch.save`` into bytes, and the launcher used to pickle those
bytes again into the message: the notebook's side then allocated two buffers per tensor (8 MB for
a 4 MB tensor, tests/launcher/test_results.py), the rank more; chapter 9's schedules, whose
gradients come back, peaked there. Here a plain CPU
tensor is pickled (protocol 5) as its raw bytes, which the notebook's side unpickles into a
``bytearray`` that the tensor then uses as its memory; the message is a short header, then the
value's pickle, read in place. Other objects (tensors that need autograd, subclasses such as
``Parameter`` or DTensor, other devices) pickle as torch and cloudpickle pickle them.
"""
from __future__ import annotations

import io
import pickle
import struct
import sys

import cloudpickle

_HEAD = struct.Struct("!QQ")  # (header length, value length)


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj):
        torch = sys.modules.get("torch")  # not imported: no tensor (the launcher imports no torch)
        if (torch is not None and type(obj) is torch.Tensor and obj.layout is torch.strided
                and obj.device.type == "cpu" and not obj.requires_grad and not obj.is_quantized):
            flat = obj.resolve_conj().resolve_neg().contiguous().reshape(-1)
            data = pickle.PickleBuffer(flat.view(torch.uint8).numpy()) if flat.numel() else bytearray()
            return _tensor, (data, obj.dtype, tuple(obj.shape))
        return super().reducer_override(obj)


def _tensor(data: bytearray, dtype, shape: tuple):
    import torch

    if not len(data):
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def dumps(value) -> bytes:
    """The value's pickle (raises as pickling it raises)."""
    out = io.BytesIO()
    _Pickler(out, protocol=5).dump(value)
    return out.getvalue()


def message(header, value_pickle: bytes = b"") -> list:
    """The chunks a rank writes: lengths, the pickled ``header``, then ``value_pickle``."""
    head = pickle.dumps(header)
    return [_HEAD.pack(len(head), len(value_pickle)), head, value_pickle]


def read(raw: bytearray):
    """``(header, value_pickle)`` from a complete message, ``value_pickle`` a view into ``raw``;
    ``None`` when it was cut short (the rank died while writing it)."""
    if len(raw) < _HEAD.size:
        return None
    n_head, n_value = _HEAD.unpack_from(raw)
    if len(raw) != _HEAD.size + n_head + n_value:
        return None
    view = memoryview(raw)
    return pickle.loads(view[_HEAD.size:_HEAD.size + n_head]), view[_HEAD.size + n_head:]


def loads(value_pickle) -> object:
    """The value back from :func:`read`'s ``value_pickle`` (its tensors use buffers of their own)."""
    return pickle.loads(value_pickle)
