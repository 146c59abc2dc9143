"""Block shapes: which fake steps a plan needs, and how layouts share them.

:func:`measure_layout` gives a layout's busiest rank from fake steps of its stages
(:func:`course_lib.plan.fake_step.run_stage`) at three and four blocks, scaled to the stage's
block count. A fake step depends on a block key (:func:`_block_key`); layouts with the same key
borrow it (:func:`_recompose`): another FSDP size from the peaks tracked per sharding factor, HSDP
as FSDP plus the replicas' all-reduce, CP as the same tokens per rank. :func:`_prefetch` lists a
round's missing fake steps by a dry pass of the planner's own calls and runs them on processes
forked from this one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from fractions import Fraction
from typing import Callable

from course_lib.plan.fake_step import StageRun, run_stage
from course_lib.plan.layouts import Candidate
from course_lib.plan.models import ModelSpec
from course_lib.plan.recipe import MESH_DIMS, mesh_sizes

__all__ = ["measure_layout", "clear_cache", "SCALE_DEPTHS", "FACTORS"]

#: fake runs already measured in this process, by what they depend on (see :func:`_block_key`)
_CACHE: dict = {}
_CACHE_SIZE = 512
_MEASURED = [0]  # fake steps run in this process
#: the two depths a stage is measured at before scaling to its block count: from three blocks on,
#: every phase's peak grows by the same bytes per block (with two, full checkpointing's backward
#: peak still sits at the loss for some layouts); deeper stages are scaled, shallower built whole
SCALE_DEPTHS = (3, 4)
#: the sharding factors every fake step tracks (a later layout with another FSDP size can borrow
#: it); a plan's dry pass adds the others its layouts need
FACTORS = frozenset(Fraction(2) ** k for k in range(-6, 7))


@contextlib.contextmanager
def _frozen_heap():
    """Python's collector skips the objects alive before the fake steps (torch, transformers):
    a collection inside a step then scans only the step's own objects (a fifth of a 70B step's
    time went to scanning the rest)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def clear_cache() -> None:
    """Forget the fake runs measured so far (the next plan measures every block shape again)."""
    _CACHE.clear()


def _group_dims(c: Candidate, ranks: tuple[int, ...]) -> tuple[str, ...]:
    """The mesh dimensions along which rank 0's group ``ranks`` of layout ``c`` spans."""
    sizes, varying = mesh_sizes(c), set()
    for r in ranks:
        for i in reversed(range(len(sizes))):
            r, coord = divmod(r, sizes[i])
            if coord:
                varying.add(i)
    return tuple(MESH_DIMS[i] for i in sorted(varying))


def _group_of(c: Candidate, dims: tuple[str, ...]) -> tuple[int, ...]:
    """Rank 0's group along ``dims`` of layout ``c`` (row-major ranks, as init_device_mesh)."""
    sizes = mesh_sizes(c)
    strides = [1] * len(sizes)
    for i in reversed(range(len(sizes) - 1)):
        strides[i] = strides[i + 1] * sizes[i + 1]
    ranks = [0]
    for d in dims:
        i = MESH_DIMS.index(d)
        ranks = [r + k * strides[i] for r in ranks for k in range(sizes[i])]
    return tuple(sorted(ranks))


def _block_key(c: Candidate, *, micro_batch: int, seq_len: int, **kw) -> tuple:
    """What a stage's fake step depends on: not ``dp_shard``, ``dp_replicate``, ``cp`` or ``pp``
    beyond whether FSDP and the experts' sharding exist at all (sharded bytes scale as
    ``1 / (dp_shard · cp)``, groups are mapped, HSDP's replicas add an all-reduce of the shard),
    nor how a rank's tokens split into sequences (every activation holds ``micro_batch × tokens``
    rows: only attention's FLOPs, ``∝ micro_batch · tokens²``, differ, and are rescaled), nor
    1F1B's microbatches in flight (a stash of activations added after)."""
    return (c.tp, c.ep, c.ac, c.fsdp > 1, c.fsdp // c.ep > 1, micro_batch * (seq_len // c.cp),
            tuple(sorted(kw.items())))


def _measured_as(c: Candidate) -> Candidate:
    """The layout a block shape is measured with: HSDP without its replicas (the same shard)."""
    return dataclasses.replace(c, dp_replicate=1)


def _factor(measured: Candidate, c: Candidate) -> Fraction:
    """How many times larger ``c``'s sharded states are than ``measured``'s."""
    return Fraction(measured.fsdp, c.fsdp)


def _recompose(run: StageRun, measured: Candidate, measured_seq: int, c: Candidate,
               seq_len: int) -> StageRun:
    """``run``, measured for layout ``measured`` at sequences of ``measured_seq`` tokens, as
    layout ``c`` with the same block key: each phase's peak as tracked with the sharded states ×
    ``measured.fsdp / c.fsdp`` (:class:`~course_lib.plan.measures._PlanTracker`); each
    collective onto ``c``'s group along the same mesh dimensions; with replicas, each gradient
    shard all-reduced across them (FSDP2's HSDP: the reduce-scatter's output); attention's FLOPs
    × the ratio of tokens per sequence."""
    if measured == c and measured_seq == seq_len:
        return run
    comm = {}
    for (kind, ranks), (n_bytes, calls) in run.comm.items():
        comm[(kind, _group_of(c, _group_dims(measured, ranks)))] = (n_bytes, calls)
    if c.dp_replicate > 1:
        replicas = _group_of(c, ("dp_replicate",))
        for (kind, ranks), (n_bytes, calls) in list(comm.items()):
            if kind == "reduce_scatter":
                n, k = comm.get(("all_reduce", replicas), (0, 0))
                comm[("all_reduce", replicas)] = (n + n_bytes / len(ranks), k + calls)
    ratio = (seq_len // c.cp) / (measured_seq // measured.cp)
    attention = run.attention_flops * ratio
    return dataclasses.replace(run.resharded(_factor(measured, c), comm), attention_flops=attention,
                               flops=run.flops - run.attention_flops + attention)


#: while a dry pass lists the fake steps a round needs (see :func:`_prefetch`):
#: key -> [config, layout measured, depth, kwargs, factors its users need]
_WANT: dict | None = None


def _zero_run() -> StageRun:
    return StageRun(0, {"forward": 0, "backward": 0}, 0, 0.0, 0.0, {}, {},
                    {"forward": 0, "backward": 0}, 0)


def _stage(config, c: Candidate, *, depth: int, **kw) -> StageRun:
    """:func:`run_stage` (one microbatch in flight), from the cache when a layout with the same
    block key was measured at this depth with ``c``'s sharding factor tracked; during a dry pass,
    noted in ``_WANT`` instead."""
    key = (config.to_json_string(use_diff=False), depth, _block_key(c, **kw))  # every field
    hit = next((e for e in _CACHE.get(key, ()) if _factor(e[0], c) in e[2].by_factor), None)
    if hit is None:
        if _WANT is not None:
            want = _WANT.setdefault(key, [config, _measured_as(c), depth, kw, set()])
            want[4].add(_factor(want[1], c))
            return _zero_run()
        measured = _measured_as(c)
        _store(key, measured, kw, _measure(config, measured, depth, kw, FACTORS))
        hit = _CACHE[key][-1]
    measured, measured_seq, run = hit
    return _recompose(run, measured, measured_seq, c, kw["seq_len"])


def _measure(config, c: Candidate, depth: int, kw: dict, factors) -> StageRun:
    return run_stage(config, c, depth=depth, in_flight=1, factors=tuple(sorted(factors)), **kw)


def _store(key, c: Candidate, kw: dict, run: StageRun) -> None:
    _MEASURED[0] += 1
    if len(_CACHE) >= _CACHE_SIZE:  # the oldest first
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE.setdefault(key, []).append((c, kw["seq_len"], run))


def _prefetch(dry: Callable[[], None], workers: int,
              progress: Callable[[int, int, str], None] | None = None) -> None:
    """Run ``dry`` (the planner's own calls) listing the fake steps it needs, then run those on
    ``workers`` processes forked from this one (each a whole fake step; the cache is filled here)."""
    global _WANT
    _WANT = {}
    try:
        dry()
    finally:
        want, _WANT = _WANT, None
    items = [(key, (config, c, depth, kw, factors | FACTORS))
             for key, (config, c, depth, kw, factors) in want.items()]
    if workers > 1 and len(items) > 1 and "fork" in multiprocessing.get_all_start_methods():
        pool = ProcessPoolExecutor(min(workers, len(items)), mp_context=multiprocessing.get_context("fork"))
        try:
            futures = {pool.submit(_measure, *args): (key, args[1], args[3]) for key, args in items}
            for done, future in enumerate(as_completed(futures)):
                key, c, kw = futures[future]
                _store(key, c, kw, future.result())  # a worker's error is raised here
                if progress:
                    progress(done, len(items), c.label)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    for done, (key, args) in enumerate(items):
        if progress:
            progress(done, len(items), args[1].label)
        _store(key, args[1], args[3], _measure(*args))


def _runs(config, c: Candidate, spec: ModelSpec, *, first: bool, last: bool, micro_batch: int,
          seq_len: int, in_flight: int, depth: int | None = None) -> tuple[StageRun, int]:
    """One stage of layout ``c``, measured at two depths and scaled to its blocks (or at
    ``depth``); with 1F1B's stash of ``in_flight - 1`` microbatches. Returns the run and the
    fake steps it took (0 when composed from cached ones)."""
    layers = depth or -(-spec.layers // c.pp)
    kw = dict(first=first, last=last, micro_batch=micro_batch, seq_len=seq_len,
              experts=spec.experts if spec.moe else None)
    before = _MEASURED[0]
    if depth is not None or layers <= SCALE_DEPTHS[1]:  # a full build
        run = _stage(config, c, depth=layers, **kw)
    else:
        a, b = (_stage(config, c, depth=d, **kw) for d in SCALE_DEPTHS)
        run = a.scaled(b, layers - SCALE_DEPTHS[0])
    return run.with_stash(in_flight), _MEASURED[0] - before


def measure_layout(config, c: Candidate, spec: ModelSpec, global_batch: int, seq_len: int,
                   depth: int | None = None) -> tuple[StageRun, int, int]:
    """The busiest rank of layout ``c``: ``(StageRun, microbatches, fake steps run)``.

    Without pipelining a rank runs its whole share of the batch at once; with it, microbatches of
    one sequence, ``min(pp, microbatches)`` in flight on the first stage (1F1B).
    """
    local = global_batch // c.dp
    micro, m = (local, 1) if c.pp == 1 else (1, local)
    first, n = _runs(config, c, spec, first=True, last=c.pp == 1, micro_batch=micro,
                     seq_len=seq_len, in_flight=min(c.pp, m), depth=depth)
    if c.pp == 1:
        return first, m, n
    last, n2 = _runs(config, c, spec, first=False, last=True, micro_batch=micro, seq_len=seq_len,
                     in_flight=1, depth=depth)
    # the busier stage's compute and bytes; the larger peak
    busy = last if last.flops >= first.flops else first
    busy = dataclasses.replace(busy, peak=max(first.peak, last.peak))
    return busy, m, n + n2


def _model_flops_per_token(config, spec: ModelSpec, seq_len: int) -> tuple[float, int]:
    """FLOPs per token of one training step without recomputation, counted on fake tensors."""
    c = Candidate()
    run, n = _runs(config, c, spec, first=True, last=True, micro_batch=1, seq_len=seq_len, in_flight=1)
    return run.flops / seq_len, n
