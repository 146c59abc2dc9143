"""One training step of one rank of a layout, on fake tensors under torch's fake process group.

Chapter 03's method (:mod:`course_lib.sharding.fake`) on transformers' model
(:func:`course_lib.plan.models.build_stage`), wrapped with torch's APIs in torchtitan's order:
``parallelize_module`` with the model's TP plan (``lm_head`` column-wise, output gathered),
``checkpoint_wrapper`` per block (selective: torchtitan's op policy), ``fully_shard`` per block
and at the root over ``dp_replicate × (dp_shard·cp)`` (bf16 compute, fp32 master weights and
reduction; a MoE's experts over the ranks ``ep`` leaves). A pipeline stage adds 1F1B's stash:
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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from course_lib.plan.layouts import Candidate
from course_lib.plan.models import build_stage
from course_lib.sharding.comm_counter import CommCounter
from course_lib.sharding.fake import fake_process_group
from course_lib.sharding.rank_measure import FSDPTracker

__all__ = ["StageRun", "run_stage", "ATTENTION_OPS", "forget_meshes"]

_SHARDED = (_FSDPRefType.SHARDED_PARAM, _FSDPRefType.SHARDED_GRAD, _FSDPRefType.OPT)
_SHARDED_NAMES = {str(k.value) for k in _SHARDED}
aten = torch.ops.aten
#: the attention kernels whose FLOPs torch's counter needs told (CPU flash attention under fake)
ATTENTION_OPS = (aten._scaled_dot_product_flash_attention_for_cpu.default,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward.default)


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


def _selective_policy():
    """torchtitan's selective op AC: save matmul, attention and reduce-scatter outputs, but
    recompute every second matmul."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save = {aten.mm.default, aten._grouped_mm.default, *ATTENTION_OPS[:1], aten.max.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default}

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func in (aten.mm.default, aten._grouped_mm.default):
            counts = policy.counts
            counts[key] = counts.get(key, 0) + 1
            if counts[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    policy.counts = {}
    return lambda: create_selective_checkpoint_contexts(policy)


def _apply_ac(layers, mode: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    for i, layer in enumerate(layers):
        kwargs = {"context_fn": _selective_policy()} if mode == "selective" else {}
        layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False, **kwargs)


def _apply_tp(model, config, mesh) -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {k: styles[v]() for k, v in (getattr(config, "base_model_tp_plan", None) or {}).items()
            if v in styles}
    if not plan:
        raise ValueError(f"model_type {config.model_type!r} has no column/row-wise TP plan in "
                         "transformers (config.base_model_tp_plan): plan it with tp = 1")
    parallelize_module(model.model, mesh, plan)
    if isinstance(model.lm_head, torch.nn.Linear):
        parallelize_module(model.lm_head, mesh, ColwiseParallel(output_layouts=Replicate()))


def _experts(layer):
    return [m for m in layer.modules() if type(m).__name__.endswith("Experts")]


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


def forget_meshes() -> None:
    """Clear DTensor's plan caches: keyed by meshes equal across fake process groups, an earlier
    run's plan would send on a destroyed group ("Could not resolve the process group")."""
    from torch.distributed.tensor import DTensor, _redistribute
    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch's own
    prop = DTensor._op_dispatcher.sharding_propagator
    prop.propagate_op_sharding.cache_clear()
    prop._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()


def _mesh(c: Candidate, experts: bool):
    """The rank's mesh, its FSDP mesh ``dp_replicate × (dp_shard·cp)`` and the experts' one."""
    mesh = init_device_mesh("cpu", (c.pp, c.dp_replicate, c.fsdp // c.ep, c.ep, c.tp),
                            mesh_dim_names=("pp", "dp_replicate", "efsdp", "ep", "tp"))
    mesh["efsdp", "ep"]._flatten("dp_shard_cp")
    return mesh, mesh["dp_replicate", "dp_shard_cp"], mesh["dp_replicate", "efsdp"] if experts else None


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
        mesh, dp_mesh, expert_mesh = _mesh(c, experts is not None and c.ep > 1)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            model = build_stage(config, depth, first=first, last=last,
                                experts=None if experts is None else experts // c.ep, seq_len=seq_len)
        # wrapped outside the mode: FSDP2 × TP builds a mesh, which fails on fake tensors
        if c.tp > 1:
            _apply_tp(model, config, mesh["tp"])
        layers = model.model.layers
        if c.ac != "none":
            _apply_ac(layers, c.ac)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        reshard = True  # also with pp: see the module's docstring
        for layer in layers:
            if expert_mesh is not None:
                for e in _experts(layer):
                    fully_shard(e, mesh=expert_mesh, mp_policy=mp, reshard_after_forward=reshard)
            fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        with mode:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            ids = torch.randint(0, config.vocab_size, (micro_batch, tokens))
            x = None if first else torch.randn(micro_batch, tokens, config.hidden_size,
                                               dtype=torch.bfloat16, requires_grad=True)
            tracker = _PlanTracker(model, opt, factors=factors)
            tracker.track_inputs((ids,) if x is None else (ids, x))
            counter, flops = _GroupCounter(), _TotalFlops(display=False, custom_mapping=_FLOPS)
            with tracker:
                _make_states(model, opt, tracker)  # Adam's moments exist, as in every step after the first
                tracker.reset_mod_stats()
                _reset_peak(tracker)
                with counter, flops:
                    act, moments, snaps, by_factor = _step(model, opt, ids, x, last, tracker)
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
               + moments for k, snap in snaps.items()}
    top = max(phases, key=phases.get)
    return StageRun(peak=phases[top], phases=phases, sharded=sharded[top],
                    flops=float(flops.get_total_flops()), attention_flops=float(attention),
                    comm=dict(comm), categories={str(getattr(k, "value", k)): v for k, v in snaps[top].items()},
                    sharded_phases=sharded, act=act,
                    by_factor={f: {k: by_factor[k][f] + stash[k] for k in phases} for f in factors})


def _reset_peak(tracker) -> None:
    """Start a new peak (``MemTracker`` keeps one per device in ``_peak_mem``, as GlobalMemTracker reads it)."""
    for dev in tracker._peak_mem:
        tracker._peak_mem[dev] = 0


def _make_states(model, opt, tracker) -> None:
    """AdamW's moments, made as its first step makes them (``_init_group``: a CPU ``step`` and two
    zero tensors like each parameter) without running that step, and tagged as optimizer states."""
    for group in opt.param_groups:
        for p in group["params"]:
            opt.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32, device="cpu"),
                            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
    tracker._track_optimizer_states(_FSDPRefType.OPT, opt)


def _step(model, opt, ids, x, last: bool, tracker) -> tuple[int, int, dict, dict]:
    """Forward, backward, optimizer step; returns the activation bytes held after the forward,
    AdamW's moments and each phase's peak snapshot (forward with the loss, backward, optimizer
    step) and each phase's per-factor peaks (:class:`_PlanTracker`)."""
    kwargs = {"input_ids": ids} if x is None else {"inputs_embeds": x}
    moments = tracker.get_tracker_snapshot()[torch.device("cpu")].get(_FSDPRefType.OPT, 0)
    tracker.moments = moments
    tracker.take_phase()
    if last:
        out = model(**kwargs, labels=ids).loss
    else:
        out = model(**kwargs).logits  # lm_head is an Identity: the hidden state sent on
    act = tracker.get_tracker_snapshot()[torch.device("cpu")].get(_FSDPRefType.ACT, 0)
    snaps = {"forward": dict(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])}
    by_factor = {"forward": tracker.take_phase()}
    _reset_peak(tracker)  # the backward's own peak from here
    if out.dim() == 0:
        out.backward()
    else:
        out.backward(torch.ones_like(out))
    snaps["backward"] = dict(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])
    by_factor["backward"] = tracker.take_phase()
    _reset_peak(tracker)
    opt.step()
    opt.zero_grad(set_to_none=True)
    snaps["step"] = dict(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])
    by_factor["step"] = tracker.take_phase()
    return act, moments, snaps, by_factor
