"""One training step of one rank of a layout, on fake tensors under torch's fake process group.

Chapter 03's method (:mod:`course_lib.sharding.fake`) on transformers' model
(:func:`course_lib.plan.models.build_stage`), wrapped with torch's APIs in torchtitan's order:
``parallelize_module`` with the model's TP plan (``lm_head`` column-wise, output gathered),
``checkpoint_wrapper`` per block (selective: torchtitan's op policy), ``fully_shard`` per block
and at the root over ``dp_replicate × (dp_shard·cp)`` (bf16 compute, fp32 master weights and
reduction; a MoE's experts over the ranks ``ep`` leaves). A pipeline stage adds 1F1B's stash:
``in_flight - 1`` more microbatches' activations. Chapter 01/03's tracker takes the peak of the
forward, the backward and the optimizer step (:mod:`course_lib.plan.measures`), torch's FLOP
counter counts FLOPs (attention and grouped expert matmuls told how), chapter 03's counter the
bytes per process group. Nothing is timed.
"""
from __future__ import annotations

import gc
import math
import warnings
from collections import defaultdict

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
from torch.distributed.device_mesh import init_device_mesh
from torch.utils import flop_counter

from course_lib.plan.layouts import Candidate
from course_lib.plan.measures import StageRun, _GroupCounter, _PlanTracker, _TotalFlops
from course_lib.plan.models import build_stage
from course_lib.sharding.fake import fake_process_group

__all__ = ["StageRun", "run_stage", "ATTENTION_OPS", "forget_meshes"]

aten = torch.ops.aten
#: the attention kernels whose FLOPs torch's counter needs told (CPU flash attention under fake)
ATTENTION_OPS = (aten._scaled_dot_product_flash_attention_for_cpu.default,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward.default)


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
