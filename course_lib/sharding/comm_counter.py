"""Count the bytes a training step hands to collectives, by type: the course's one byte counter.

DDP's reducer (C++), FSDP2 and ``ZeroRedundancyOptimizer`` all call the c10d operators
``torch.ops.c10d.*`` through the dispatcher, on gloo as on NCCL; DTensor and compiled code call
the functional ``torch.ops._c10d_functional.*``. :class:`CommCounter`, a ``TorchDispatchMode``,
sees every such call on this rank while active (also those DDP issues inside ``backward``) and
records the **message size** ``S`` as nccl-tests prints it: the whole buffer, i.e. the larger of
the operator's first two tensor arguments. The **volume** is the ZeRO paper's count of what a
rank sends: ``2·S`` for an all-reduce (a ring's reduce-scatter plus all-gather), ``S`` for the
rest, so DP moves ``2Ψ`` per step and ZeRO-3 ``3Ψ``. Works inside ``course_lib.run`` and under
``FakeTensorMode``: ``with CommCounter() as comm: ...`` then ``comm.bytes_by_type()`` (e.g.
``{"all_reduce": 4_194_304}``) and ``comm.volume()``.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["CommCounter", "COLLECTIVE_NAMES", "FUNCTIONAL_NAMES", "volume_factor"]

#: c10d operator name -> collective type, as the course names them.
COLLECTIVE_NAMES: dict[str, str] = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "_allgather_base_": "all_gather", "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather", "allgather_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast", "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "send": "send", "recv_": "recv",
    "recv_any_source_": "recv",
}
#: functional collective (``_c10d_functional::``) -> collective type. Their autograd variants
#: (``_c10d_functional_autograd::``) call these inside, so they are not listed (no double count).
FUNCTIONAL_NAMES: dict[str, str] = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast",
}


def volume_factor(collective: str) -> int:
    """ZeRO-paper volume per byte of message: 2 for all-reduce, 1 for every other collective."""
    return 2 if collective == "all_reduce" else 1


def _nbytes(arg: Any) -> int:
    leaves, _ = tree_flatten(arg)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class CommCounter(TorchDispatchMode):
    """Records ``(collective, message bytes, dtype)`` for every c10d or functional collective while active.

    ``calls`` lists them in order; :meth:`bytes_by_type`, :meth:`calls_by_type` and
    :meth:`volume` summarise. Barriers and other tensor-less calls are ignored.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, torch.dtype | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        space, _, name = schema.name.partition("::") if schema is not None else ("", "", "")
        out = func(*args, **kwargs)
        if space == "c10d" and name in COLLECTIVE_NAMES:      # in place: output is an argument
            self._record(COLLECTIVE_NAMES[name], args[:2], args[:2])
        elif space == "_c10d_functional" and name in FUNCTIONAL_NAMES:
            self._record(FUNCTIONAL_NAMES[name], (args[0], out), args[:1])
        return out

    def _record(self, kind: str, buffers: tuple, inputs: tuple) -> None:
        """One call: its message size is the larger of ``buffers`` (input and output)."""
        leaves = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)]
        self.calls.append((kind, max(_nbytes(b) for b in buffers) if buffers else 0,
                           leaves[0].dtype if leaves else None))

    def reset(self) -> None:
        """Forget what was counted so far (e.g. between a warm-up step and a measured one)."""
        self.calls.clear()

    def bytes_by_type(self) -> dict[str, int]:
        """Message bytes summed per collective type."""
        out: Counter[str] = Counter()
        for kind, size, _ in self.calls:
            out[kind] += size
        return dict(out)

    def calls_by_type(self) -> dict[str, int]:
        """Number of calls per collective type."""
        return dict(Counter(kind for kind, _, _ in self.calls))

    def volume(self) -> int:
        """Bytes one rank sends in the ZeRO paper's accounting (all-reduce counts twice)."""
        return sum(volume_factor(kind) * size for kind, size, _ in self.calls)
