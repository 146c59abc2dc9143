"""Will it fit, and how fast? Every layout of a model on a cluster, measured on fake tensors.

:func:`plan` reads a config (:mod:`course_lib.plan.models`), lists every layout of the GPU count
(:mod:`course_lib.plan.layouts`) and, per layout, runs one fake training step of its busiest
ranks (:mod:`course_lib.plan.fake_step`: the first pipeline stage and, with ``pp > 1``, the last)
at three and four blocks, scaled to its layer count (from three blocks on, every block adds the
same bytes to each phase's peak; equal to a full build in ``tests/plan``). Each layout gets the
lightest activation checkpointing that fits (a lighter mode is always faster), found by bisection:
selective first, then none or full. Each round's fake steps are listed by a dry pass and run on
two processes forked from this one. The step time comes from :mod:`course_lib.plan.predict`. The answer is a
:class:`Plan` whose rows are sorted best first (fits, then tokens/s per GPU) and whose
``assumptions`` say everything the numbers rest on.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from fractions import Fraction
from typing import Callable

from course_lib.plan.clusters import Cluster, GiB, get_cluster
from course_lib.plan.fake_step import StageRun, run_stage
from course_lib.plan.layouts import AC_MODES, Candidate, enumerate_layouts
from course_lib.plan.models import ConfigError, ModelSpec, load_config, model_spec
from course_lib.plan.predict import StepTime, step_time

__all__ = ["PlanRow", "Plan", "plan", "plan_text", "measure_layout", "DEFAULTS", "clear_cache"]

#: the assumptions a plan prints; change them with plan()'s keyword arguments
DEFAULTS = {"efficiency": 0.40, "fragmentation": 0.10, "reserved_gib": 1.0}


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One layout: its per-GPU peak (measured on fake tensors), verdict and predicted speed."""

    layout: Candidate
    fits: bool
    peak_gib: float          # the busiest rank's tracked peak (fake tensors)
    need_gib: float          # peak × (1 + fragmentation margin): what the verdict compares
    tokens_per_s_gpu: float
    mfu: float
    step: StepTime
    microbatches: int

    @property
    def label(self) -> str:
        ac = {"none": "", "selective": " · AC sel", "full": " · AC full"}[self.layout.ac]
        return self.layout.label + ac


@dataclasses.dataclass
class Plan:
    """:func:`plan`'s answer; ``rows`` best first; ``str()`` is the printed table."""

    model: ModelSpec
    cluster: Cluster
    gpus: int
    global_batch: int
    seq_len: int
    rows: list[PlanRow]
    assumptions: dict
    model_flops_per_token: float
    seconds: float
    runs: int
    stored: str | None = None  # the date a stored table was computed (course_lib.plan.stored)

    @property
    def best(self) -> PlanRow | None:
        return self.rows[0] if self.rows and self.rows[0].fits else None

    def __str__(self) -> str:
        return plan_text(self)


#: fake runs already measured in this process, by what they depend on (see :func:`_block_key`)
_CACHE: dict = {}
_CACHE_SIZE = 512
_MEASURED = [0]  # fake steps run in this process
MESH_DIMS = ("pp", "dp_replicate", "efsdp", "ep", "tp")
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


def _mesh_sizes(c: Candidate) -> tuple[int, ...]:
    """The fake step's mesh (:func:`course_lib.plan.recipe.layout_mesh`), outermost first."""
    return (c.pp, c.dp_replicate, c.fsdp // c.ep, c.ep, c.tp)


def _group_dims(c: Candidate, ranks: tuple[int, ...]) -> tuple[str, ...]:
    """The mesh dimensions along which rank 0's group ``ranks`` of layout ``c`` spans."""
    sizes, varying = _mesh_sizes(c), set()
    for r in ranks:
        for i in reversed(range(len(sizes))):
            r, coord = divmod(r, sizes[i])
            if coord:
                varying.add(i)
    return tuple(MESH_DIMS[i] for i in sorted(varying))


def _group_of(c: Candidate, dims: tuple[str, ...]) -> tuple[int, ...]:
    """Rank 0's group along ``dims`` of layout ``c`` (row-major ranks, as init_device_mesh)."""
    sizes = _mesh_sizes(c)
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
    ``measured.fsdp / c.fsdp`` (:class:`~course_lib.plan.recipe._PlanTracker`); each
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


def plan(model, *, gpus: int, gpus_per_node: int | None = None, cluster: str | Cluster = "h100-80gb",
         memory_gib: float | None = None, global_batch: int | None = None, seq_len: int = 8192,
         layouts: list[Candidate] | None = None, efficiency: float = DEFAULTS["efficiency"],
         fragmentation: float = DEFAULTS["fragmentation"], reserved_gib: float = DEFAULTS["reserved_gib"],
         progress: Callable[[int, int, str], None] | None = None, workers: int | None = None) -> Plan:
    """Plan ``model`` (a stored name, a config.json path or dict, or a transformers config) on
    ``gpus`` GPUs of ``cluster`` (a preset key or a :class:`Cluster`), a global batch of
    ``global_batch`` sequences (default: one per GPU) of ``seq_len`` tokens.

    ``layouts`` restricts the candidates (their ``ac`` is the lightest checkpointing tried).
    ``progress(done, total, label)`` is called as each fake step of a round ends; ``workers``
    processes run them (default: two where the machine has two cores). Raises :class:`ConfigError`
    naming a bad config field and ``ValueError`` for a bad request, before anything runs.
    """
    start = time.perf_counter()
    config = load_config(model)
    spec = model_spec(config)
    cluster = get_cluster(cluster, gpus_per_node, memory_gib)
    for name, value in (("gpus", gpus), ("gpus_per_node", cluster.gpus_per_node), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if gpus > cluster.gpus_per_node and gpus % cluster.gpus_per_node:
        raise ValueError(f"gpus ({gpus}) must be a multiple of gpus_per_node ({cluster.gpus_per_node})")
    global_batch = gpus if global_batch is None else global_batch
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be a positive integer (sequences), got {global_batch!r}")
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    if layouts is None:
        layouts = [c for c in enumerate_layouts(gpus, cluster.gpus_per_node, spec, global_batch,
                                                seq_len, ac_modes=("none",))]
    usable = (cluster.memory_gib - reserved_gib) * GiB
    workers = min(2, os.cpu_count() or 1) if workers is None else workers
    with _frozen_heap():
        before = _MEASURED[0]
        _prefetch(lambda: _model_flops_per_token(config, spec, seq_len), workers)
        flops_token, _ = _model_flops_per_token(config, spec, seq_len)
        # per layout, the lightest checkpointing that fits, by bisection over its modes (a
        # heavier mode never holds more): two rounds of fake steps where trying each in turn took three
        ladders = [[dataclasses.replace(first, ac=ac) for ac in AC_MODES[AC_MODES.index(first.ac):]]
                   for first in layouts]
        bounds = [[0, len(ladder) - 1] for ladder in ladders]
        seen: list[dict] = [{} for _ in layouts]  # mode index -> (run, microbatches, fits)
        while True:
            probes = [(k, (lo + hi) // 2) for k, (lo, hi) in enumerate(bounds)
                      if lo < hi or lo not in seen[k]]
            if not probes:
                break
            _prefetch(lambda: [measure_layout(config, ladders[k][i], spec, global_batch, seq_len)
                               for k, i in probes], workers, progress)
            for k, i in probes:
                run, m, _ = measure_layout(config, ladders[k][i], spec, global_batch, seq_len)
                fits = run.peak * (1 + fragmentation) <= usable
                seen[k][i] = (run, m, fits)
                if fits:
                    bounds[k][1] = i
                else:
                    bounds[k][0] = min(i + 1, len(ladders[k]) - 1)
        rows = []
        for k, (lo, _) in enumerate(bounds):
            c, (run, m, fits) = ladders[k][lo], seen[k][lo]
            local = global_batch // c.dp
            micro = local if c.pp == 1 else 1
            flops = run.flops * m + run.attention_flops * m * (c.cp - 1)
            t = step_time(c, spec, cluster, flops=flops, comm=run.comm, micro_batch=micro,
                          seq_len=seq_len, microbatches=m, efficiency=efficiency)
            tps = global_batch * seq_len / t.total / gpus
            rows.append(PlanRow(c, fits, run.peak / GiB, run.peak * (1 + fragmentation) / GiB, tps,
                                flops_token * tps / (cluster.peak_tflops * 1e12), t, m))
        runs = _MEASURED[0] - before
    rows.sort(key=lambda r: (not r.fits, -r.tokens_per_s_gpu))
    assumptions = {
        "precision": "bf16 compute, fp32 master weights, fp32 AdamW moments, gradients reduced in fp32 "
                     "(FSDP2 MixedPrecisionPolicy)",
        "memory": f"fits when tracked peak × (1 + {fragmentation:.0%} fragmentation margin) ≤ "
                  f"{cluster.memory_gib:g} GiB − {reserved_gib:g} GiB (CUDA context, NCCL buffers)",
        "compute": f"FLOPs counted by torch's FlopCounterMode on the busiest rank, at {efficiency:.0%} "
                   f"of the peak {cluster.peak_tflops:g} TFLOP/s (dense bf16)",
        "links": f"NVLink {cluster.nvlink_gbps:g} GB/s, α {cluster.nvlink_alpha_us:g} µs inside a node of "
                 f"{cluster.gpus_per_node}; {cluster.internode_gbps:g} GB/s, α {cluster.internode_alpha_us:g} µs "
                 "between nodes (per GPU, each direction); ring collectives (chapter 05's α-β)",
        "overlap": "FSDP/HSDP and the CP ring hidden behind compute; TP, EP all-to-all and pipeline "
                   "sends exposed; 1F1B bubble (pp - 1)/microbatches",
        "pipeline": "microbatches of one sequence; FSDP reshards after forward in every layout",
        "scaling": f"each stage measured at {SCALE_DEPTHS[0]} and {SCALE_DEPTHS[1]} blocks and scaled "
                   "linearly to its block count (equal to a full build to the byte: tests/plan); "
                   "layouts that differ only in dp_shard, dp_replicate or pp share those runs "
                   "(sharded bytes rescaled by the FSDP group's size, groups mapped)",
        "moe": "routing balanced: each rank's experts receive top_k × its tokens; ep borrows ranks "
               "from dp_shard·cp and keeps at least top_k experts per rank" if spec.moe else "dense",
        "attention": "transformers' sdpa (flash attention's memory: no S × S matrix); a sliding window "
                     "longer than the sequence dropped; attention FLOPs counted unmasked (torchtitan's "
                     "convention)",
        "source of the peak and platform": cluster.source,
    }
    return Plan(spec, cluster, gpus, global_batch, seq_len, rows, assumptions, flops_token,
                time.perf_counter() - start, runs)


def plan_text(p, top: int | None = 15) -> str:
    """The table (best first, ``top`` rows; ``None``: all) and every assumption."""
    lines = [f"{p.model.name}: {p.gpus} × {p.cluster.name}, global batch {p.global_batch} × "
             f"{p.seq_len} tokens",
             f"{'layout':34} {'fits':>4} {'GiB/GPU':>8} {'tok/s/GPU':>10} {'MFU':>6} {'step s':>7}"]
    for r in p.rows[:top]:
        lines.append(f"{r.label:34} {'yes' if r.fits else 'no':>4} {r.need_gib:8.1f} "
                     f"{r.tokens_per_s_gpu:10,.0f} {r.mfu:6.1%} {r.step.total:7.2f}")
    if top is not None and len(p.rows) > top:
        lines.append(f"... {len(p.rows) - top} more layouts ({sum(r.fits for r in p.rows)} of "
                     f"{len(p.rows)} fit)")
    when = f"stored, computed {p.stored}" if p.stored else f"in {p.seconds:.1f} s"
    lines.append(f"measured: {p.runs} fake training steps ({when}); model FLOPs "
                 f"{p.model_flops_per_token / 1e9:.1f} GFLOP per token (counted)")
    lines.append("assumptions:")
    lines += [f"  {key}: {value}" for key, value in p.assumptions.items()]
    return "\n".join(lines)
