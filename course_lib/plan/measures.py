"""What a planner's fake step records, and the instruments that record it.

:class:`StageRun` is one rank's step: each phase's peak (forward, backward, optimizer step), the
same with the sharded states × f (``by_factor``: the step on ``1 / f`` as many FSDP ranks),
FLOPs and bytes per process group; it scales in depth, adds 1F1B's stash and reshards.
:class:`_PlanTracker` is chapter 03's tracker keeping those per-factor peaks, :class:`_TotalFlops`
torch's FLOP counter without its module hooks (their reference cycles held recomputed blocks
alive) and running each op as it is (:class:`_CountAsRun`), :class:`_GroupCounter` chapter 03's collective counter with each call's group.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from course_lib.sharding.comm_counter import CommCounter
from course_lib.sharding.rank_measure import FSDPTracker

__all__ = ["StageRun"]

_SHARDED = (_FSDPRefType.SHARDED_PARAM, _FSDPRefType.SHARDED_GRAD, _FSDPRefType.OPT)
_SHARDED_NAMES = {str(k.value) for k in _SHARDED}
@dataclasses.dataclass
class StageRun:
    """What one fake step of one rank measured; ``comm``: ``{(collective, group ranks): (bytes, calls)}``."""

    peak: int                    # the larger of the phases' peaks
    phases: dict                 # peak bytes in the forward and in the backward + optimizer step
    sharded: int                 # at the peak: sharded parameters, gradients, optimizer states
    flops: float
    attention_flops: float
    comm: dict
    categories: dict
    sharded_phases: dict = dataclasses.field(default_factory=dict)  # sharded bytes at each phase's peak
    act: int = 0                 # one microbatch's activations held after its forward
    by_factor: dict = dataclasses.field(default_factory=dict)  # {f: phases} with sharded states × f

    def with_stash(self, in_flight: int) -> "StageRun":
        """This run (measured with one microbatch in flight) with 1F1B's stash: ``in_flight - 1``
        more microbatches' activations in the forward and backward (not the optimizer step)."""
        stash = (in_flight - 1) * self.act
        add = lambda ph: {k: v + (stash if k != "step" else 0) for k, v in ph.items()}  # noqa: E731
        phases = add(self.phases)
        return dataclasses.replace(self, peak=max(phases.values()), phases=phases,
                                   by_factor={f: add(ph) for f, ph in self.by_factor.items()})

    def scaled(self, other: "StageRun", k: float) -> "StageRun":
        """``self + k · (other - self)``: linear extrapolation in depth, each phase's peak apart
        (the peak moves from the loss to the backward as blocks are added)."""
        keys = set(self.comm) | set(other.comm)
        cats = set(self.categories) | set(other.categories)
        lin = lambda a, b: a + k * (b - a)  # noqa: E731
        phases = {k: int(lin(self.phases[k], other.phases[k])) for k in self.phases}
        return StageRun(max(phases.values()), phases, int(lin(self.sharded, other.sharded)),
                        lin(self.flops, other.flops), lin(self.attention_flops, other.attention_flops),
                        {key: tuple(lin(a, b) for a, b in zip(self.comm.get(key, (0, 0)),
                                                              other.comm.get(key, (0, 0))))
                         for key in keys},
                        {c: lin(self.categories.get(c, 0), other.categories.get(c, 0)) for c in cats},
                        {k: int(lin(self.sharded_phases[k], other.sharded_phases[k]))
                         for k in self.sharded_phases}, int(lin(self.act, other.act)),
                        {f: {k: int(lin(ph[k], other.by_factor[f][k])) for k in ph}
                         for f, ph in self.by_factor.items() if f in other.by_factor})

    def resharded(self, factor: float, comm: dict) -> "StageRun":
        """This run with its sharded bytes (parameters, gradients, optimizer states) times
        ``factor`` (FSDP over ``1 / factor`` as many ranks) and ``comm`` instead of its own."""
        phases = self.by_factor[factor]  # the peak of each phase with the states × factor (exact)
        cats = {c: v * factor if c in _SHARDED_NAMES else v for c, v in self.categories.items()}
        return dataclasses.replace(self, peak=max(phases.values()), phases=phases,
                                   by_factor={f / factor: ph for f, ph in self.by_factor.items()},
                                   sharded=int(self.sharded * factor), comm=comm, categories=cats,
                                   sharded_phases={k: int(v * factor)
                                                   for k, v in self.sharded_phases.items()})


class _PlanTracker(FSDPTracker):
    """Chapter 03's tracker, also keeping the peak each phase would have with its sharded states
    (parameters, gradients, AdamW's moments) ``f`` times as large, for each ``f`` in ``factors``:
    the same step on ``1 / f`` as many FSDP ranks, where the peak may sit at another moment (an
    early-backward peak at FSDP 64 moves to the end of the backward at FSDP 8)."""

    def __init__(self, *args, factors=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.factors = tuple(factors)
        self.moments = 0
        self.by_factor = {f: 0 for f in self.factors}

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        for snap in self._curr_mem_snap.values():
            sharded = (snap.get(_FSDPRefType.SHARDED_PARAM, 0) + snap.get(_FSDPRefType.SHARDED_GRAD, 0)
                       + self.moments)
            for f in self.factors:
                value = snap["Total"] + int(sharded * (f - 1))
                if value > self.by_factor[f]:
                    self.by_factor[f] = value

    def take_phase(self) -> dict:
        """The per-factor peaks since the last call; starts the next phase's."""
        out, self.by_factor = self.by_factor, {f: 0 for f in self.factors}
        return out


class _NoModules:
    """Stands in for ``FlopCounterMode``'s ``ModuleTracker``: every FLOP counts under "Global" only."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        pass


class _TotalFlops(FlopCounterMode):
    """torch's FLOP counter without its per-module breakdown, which the planner never reads.

    The breakdown's ``ModuleTracker`` puts a multi-grad hook on every module's outputs; the
    hook's closures and the autograd nodes form reference cycles that keep a recomputed block's
    saved tensors alive until the collector runs. Under full activation checkpointing that held
    1-2.6 GiB more per block of Llama 3.1 70B in the backward (179 GiB planned at 80 blocks); a
    training run has no such hooks.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.mod_tracker = _NoModules()

    def __enter__(self):
        self.flop_counts.clear()
        self.mode = _CountAsRun(self)
        self.mode.__enter__()
        return self


class _CountAsRun(TorchDispatchMode):
    """Counts each op's FLOPs with torch's formulas, running the op itself. torch's own mode runs
    an op without a formula through its decomposition instead: ``silu_backward`` (SwiGLU's)
    then made temporaries the fused kernel does not, +2,023,424 B (+5.7 %) in the backward of a
    small Llama with FSDP 4 and full checkpointing against real ranks (tests/plan/test_real_llama.py)."""

    def __init__(self, counter: FlopCounterMode) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        return self.counter._count_flops(func._overloadpacket, out, args, kwargs)


class _GroupCounter(CommCounter):
    """Chapter 03's counter; each call also notes the global ranks of its process group."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = len(self.calls)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.calls) > before:
            group = None
            for a in args:
                if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
                    group = dist.ProcessGroup.unbox(a)
                elif isinstance(a, str) and group is None and func.namespace == "_c10d_functional":
                    try:
                        group = _resolve_process_group(a)
                    except (KeyError, RuntimeError, ValueError):
                        pass
            self.groups.append(tuple(dist.get_process_group_ranks(group)) if group else ())
        return out
