"""One training step of one rank of a layout, on fake tensors under torch's fake process group.

Chapter 03's method (:mod:`course_lib.sharding.fake`) on transformers' model
(:func:`course_lib.plan.models.build_stage`) with the layout's recipe
(:mod:`course_lib.plan.recipe`: the TP plan, activation checkpointing, ``fully_shard`` with bf16
compute and fp32 master weights, AdamW's moments, one tracked step), the same code the check on
real ranks runs (:mod:`course_lib.plan.real`). A pipeline stage adds 1F1B's stash:
``in_flight - 1`` more microbatches' activations. Chapter 01/03's tracker takes the peak of the
forward and of the backward, ``FlopCounterMode`` counts FLOPs (attention and grouped expert
matmuls told how), ``CommCounter`` the bytes per process group. Nothing is timed.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import warnings
from collections import defaultdict

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from course_lib.plan.layouts import Candidate
from course_lib.plan.models import build_stage, unpacked_rows
from course_lib.plan.recipe import (ATTENTION_OPS, SHARDED, forget_meshes, layout_mesh, tracked_step,
                                    wrap_stage)
from course_lib.sharding.comm_counter import CommCounter
from course_lib.sharding.fake import fake_process_group

# ATTENTION_OPS and forget_meshes live in recipe.py; named here too, where they were first
__all__ = ["StageRun", "run_stage", "ATTENTION_OPS", "forget_meshes"]

_SHARDED_NAMES = {str(k.value) for k in SHARDED}
aten = torch.ops.aten


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


def _sdpa_fwd(q, k, v, *args, **kwargs):
    return flop_counter.sdpa_flop_count(q, k, v)


def _sdpa_bwd(grad, q, k, v, *args, **kwargs):
    return flop_counter.sdpa_backward_flop_count(grad, q, k, v)


def _grouped_mm(a, b, *args, out_shape=None, **kwargs):
    if len(a) == 2 and len(b) == 2:        # weight gradient: (K, T) x (T, N) -> (E, K, N)
        return 2 * a[0] * a[1] * b[1]
    return 2 * math.prod(out_shape) * a[-1]


_FLOPS = {ATTENTION_OPS[0].overloadpacket: _sdpa_fwd, ATTENTION_OPS[1].overloadpacket: _sdpa_bwd,
          aten._grouped_mm: _grouped_mm}


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


def run_stage(config, c: Candidate, *, depth: int, first: bool, last: bool, micro_batch: int,
              seq_len: int, in_flight: int, experts: int | None = None, factors=()) -> StageRun:
    """One fake step of a rank holding ``depth`` blocks of the stage (``first``/``last``) of
    layout ``c``, ``in_flight`` microbatches of ``micro_batch × seq_len / cp`` tokens; also each
    phase's peak with the sharded states × each of ``factors`` (``StageRun.by_factor``)."""
    tokens = seq_len // c.cp
    gc.collect()
    forget_meshes()
    with fake_process_group(0, c.world), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshes = layout_mesh(c, experts is not None and c.ep > 1)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            model = build_stage(config, depth, first=first, last=last,
                                experts=None if experts is None else experts // c.ep, seq_len=seq_len)
        # wrapped outside the mode: FSDP2 × TP builds a mesh, which fails on fake tensors
        wrap_stage(model, config, c, *meshes)
        with mode:
            ids = torch.randint(0, config.vocab_size, (micro_batch, tokens))
            x = None if first else torch.randn(micro_batch, tokens, config.hidden_size,
                                               dtype=torch.bfloat16, requires_grad=True)
            counter, flops = _GroupCounter(), _TotalFlops(display=False, custom_mapping=_FLOPS)
            with unpacked_rows():  # as transformers finds on real tensors
                step = tracked_step(model, ids, x, last=last, modes=(counter, flops), factors=factors)
    act, snaps, by_factor = step.act, step.snaps, step.by_factor
    comm = defaultdict(lambda: (0, 0))
    for (kind, size, _), ranks in zip(counter.calls, counter.groups):
        if len(ranks) > 1:
            n, calls = comm[(kind, ranks)]
            comm[(kind, ranks)] = (n + size, calls + 1)
    counts = flops.get_flop_counts().get("Global", {})
    attention = sum(v for op, v in counts.items() if op in (o.overloadpacket for o in ATTENTION_OPS))
    # 1F1B: the other microbatches' stashes, held until their backward (not in the optimizer step)
    stash = {"forward": (in_flight - 1) * act, "backward": (in_flight - 1) * act, "step": 0}
    phases = {k: snap["Total"] + stash[k] for k, snap in snaps.items()}
    # sharded: parameters, gradients and the moments (the tracker files everything the optimizer
    # step allocates as its state, temporaries included: ~12 GiB that do not shrink with the shard
    # for Llama 3.1 70B, at FSDP 64 as at 8)
    sharded = {k: snap.get(_FSDPRefType.SHARDED_PARAM, 0) + snap.get(_FSDPRefType.SHARDED_GRAD, 0)
               + step.moments for k, snap in snaps.items()}
    top = max(phases, key=phases.get)
    return StageRun(peak=phases[top], phases=phases, sharded=sharded[top],
                    flops=float(flops.get_total_flops()), attention_flops=float(attention),
                    comm=dict(comm), categories={str(getattr(k, "value", k)): v for k, v in snaps[top].items()},
                    sharded_phases=sharded, act=act,
                    by_factor={f: {k: by_factor[k][f] + stash[k] for k in phases} for f in factors})
