"""Will it fit, and how fast? Every layout of a model on a cluster, measured on fake tensors.

:func:`plan` reads a config (:mod:`course_lib.plan.models`), lists every layout of the GPU count
(:mod:`course_lib.plan.layouts`) and, per layout, runs one fake training step of its busiest
ranks (:mod:`course_lib.plan.fake_step`: the first pipeline stage and, with ``pp > 1``, the last)
at three and four blocks, scaled to its layer count (from three blocks on, every block adds the
same bytes to each phase's peak; equal to a full build in ``tests/plan``). Activation checkpointing is tried in the order none,
selective, full, until the layout fits: a lighter mode that fits is always faster, so the heavier
ones are not run. The step time comes from :mod:`course_lib.plan.predict`. The answer is a
:class:`Plan` whose rows are sorted best first (fits, then tokens/s per GPU) and whose
``assumptions`` say everything the numbers rest on.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
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
    """The fake step's mesh (:func:`course_lib.plan.fake_step.layout_mesh`), outermost first."""
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


def _block_key(c: Candidate, **kw) -> tuple:
    """What a stage's fake step depends on: not ``dp_shard``, ``dp_replicate`` or ``pp`` beyond
    whether FSDP, the experts' sharding and HSDP's replication exist at all (their sharded bytes
    scale as ``1 / (dp_shard · cp)``, their groups are mapped), nor 1F1B's microbatches in flight
    (a stash of activations added after)."""
    return (c.tp, c.cp, c.ep, c.ac, c.fsdp > 1, c.fsdp // c.ep > 1, c.dp_replicate > 1,
            tuple(sorted(kw.items())))


def _recompose(run: StageRun, measured: Candidate, c: Candidate) -> StageRun:
    """``run``, measured for layout ``measured``, as layout ``c`` with the same block key:
    sharded bytes × ``measured.fsdp / c.fsdp``; each collective onto ``c``'s group along the
    same mesh dimensions (a replica group's all-reduce carries the shard: its bytes scale too)."""
    factor = measured.fsdp / c.fsdp
    comm = {}
    for (kind, ranks), (n_bytes, calls) in run.comm.items():
        dims = _group_dims(measured, ranks)
        if dims == ("dp_replicate",):
            n_bytes = n_bytes * factor
        comm[(kind, _group_of(c, dims))] = (n_bytes, calls)
    return run if measured == c else run.resharded(factor, comm)


def _stage(config, c: Candidate, *, depth: int, **kw) -> StageRun:
    """:func:`run_stage` (one microbatch in flight), from the cache when a layout with the same
    block key was measured at this depth."""
    key = (config.to_json_string(use_diff=False), depth, _block_key(c, **kw))  # every field
    if key in _CACHE:
        measured, run = _CACHE[key]
        return _recompose(run, measured, c)
    run = run_stage(config, c, depth=depth, in_flight=1, **kw)
    _MEASURED[0] += 1
    if len(_CACHE) >= _CACHE_SIZE:  # the oldest first
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (c, run)
    return run


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
         progress: Callable[[int, int, str], None] | None = None) -> Plan:
    """Plan ``model`` (a stored name, a config.json path or dict, or a transformers config) on
    ``gpus`` GPUs of ``cluster`` (a preset key or a :class:`Cluster`), a global batch of
    ``global_batch`` sequences (default: one per GPU) of ``seq_len`` tokens.

    ``layouts`` restricts the candidates (their ``ac`` is where the escalation starts).
    ``progress(done, total, label)`` is called before each layout. Raises :class:`ConfigError`
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
    with _frozen_heap():
        flops_token, runs = _model_flops_per_token(config, spec, seq_len)
        rows = []
        for i, first in enumerate(layouts):
            if progress:
                progress(i, len(layouts), first.label)
            modes = AC_MODES[AC_MODES.index(first.ac):]
            for ac in modes:
                c = dataclasses.replace(first, ac=ac)
                run, m, n = measure_layout(config, c, spec, global_batch, seq_len)
                runs += n
                fits = run.peak * (1 + fragmentation) <= usable
                if fits or ac == modes[-1]:
                    break
            local = global_batch // c.dp
            micro = local if c.pp == 1 else 1
            flops = run.flops * m + run.attention_flops * m * (c.cp - 1)
            t = step_time(c, spec, cluster, flops=flops, comm=run.comm, micro_batch=micro,
                          seq_len=seq_len, microbatches=m, efficiency=efficiency)
            tps = global_batch * seq_len / t.total / gpus
            rows.append(PlanRow(c, fits, run.peak / GiB, run.peak * (1 + fragmentation) / GiB, tps, flops_token * tps / (cluster.peak_tflops * 1e12),
                                t, m))
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
