"""One training step of one rank of a layout, on fake tensors under torch's fake process group.

Chapter 03's method (:mod:`course_lib.sharding.fake`) on transformers' model
(:func:`course_lib.plan.models.build_stage`) with the layout's recipe
(:mod:`course_lib.plan.recipe`: the TP plan, activation checkpointing, ``fully_shard`` with bf16
compute and fp32 master weights, AdamW's moments, one tracked step), the same code the check on
real ranks runs (:mod:`course_lib.plan.real`). A pipeline stage adds 1F1B's stash:
``in_flight - 1`` more microbatches' activations. Chapter 01/03's tracker takes the peak of the
forward, the backward and the optimizer step (:mod:`course_lib.plan.measures`), ``FlopCounterMode`` counts FLOPs (attention and grouped expert
matmuls told how), ``CommCounter`` the bytes per process group. Nothing is timed.
"""
from __future__ import annotations

import gc
import math
import warnings
from collections import defaultdict

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
from torch.utils import flop_counter

from course_lib.plan.layouts import Candidate
from course_lib.plan.measures import StageRun, _GroupCounter, _TotalFlops
from course_lib.plan.models import build_stage, unpacked_rows
from course_lib.plan.recipe import ATTENTION_OPS, forget_meshes, layout_mesh, tracked_step, wrap_stage
from course_lib.sharding.fake import fake_process_group

# ATTENTION_OPS and forget_meshes live in recipe.py; named here too, where they were first
__all__ = ["StageRun", "run_stage", "ATTENTION_OPS", "forget_meshes"]

aten = torch.ops.aten


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
