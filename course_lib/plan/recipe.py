"""One rank's training recipe for a planner layout, on whatever tensors it is given: fake or real.

The planner's fake step (:mod:`course_lib.plan.fake_step`) and the check on real CPU ranks
(:mod:`course_lib.plan.real`) run the same code, from here: :func:`layout_mesh` (torchtitan's
mesh ``pp × dp_replicate × (dp_shard·cp) × tp``, the experts' sharding inside ``dp_shard·cp``),
:func:`wrap_stage` (``parallelize_module`` with the model's TP plan, ``lm_head`` column-wise with
its output gathered; ``checkpoint_wrapper`` per block, selective: torchtitan's op policy;
``fully_shard`` per block and at the root over ``dp_replicate × (dp_shard·cp)``, bf16 compute,
fp32 master weights and reduction, a MoE's experts over the ranks ``ep`` leaves) and
:func:`tracked_step` (AdamW with its moments made up front, one step under chapter 03's tracker:
the peak of the forward, of the backward and of the optimizer step).
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
from torch.distributed.device_mesh import init_device_mesh

from course_lib.plan.layouts import Candidate
from course_lib.plan.measures import _PlanTracker

__all__ = ["ATTENTION_OPS", "MESH_DIMS", "mesh_sizes", "StepPeaks", "layout_mesh", "wrap_stage", "tracked_step",
           "forget_meshes"]

aten = torch.ops.aten
#: the attention kernels (CPU flash attention): selective checkpointing saves the forward's output;
#: the fake step's FLOP counter is told how to count both
ATTENTION_OPS = (aten._scaled_dot_product_flash_attention_for_cpu.default,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward.default)


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


#: the layout mesh's dimensions, outermost first (:func:`mesh_sizes` gives their sizes)
MESH_DIMS = ("pp", "dp_replicate", "efsdp", "ep", "tp")


def mesh_sizes(c: Candidate) -> tuple[int, ...]:
    """Layout ``c``'s mesh sizes along :data:`MESH_DIMS` (FSDP's ``dp_shard·cp`` split as the
    experts' shard ``efsdp`` × ``ep``)."""
    return (c.pp, c.dp_replicate, c.fsdp // c.ep, c.ep, c.tp)


def layout_mesh(c: Candidate, experts: bool):
    """The rank's mesh, its FSDP mesh ``dp_replicate × (dp_shard·cp)`` and the experts' one."""
    mesh = init_device_mesh("cpu", mesh_sizes(c), mesh_dim_names=MESH_DIMS)
    mesh["efsdp", "ep"]._flatten("dp_shard_cp")
    return mesh, mesh["dp_replicate", "dp_shard_cp"], mesh["dp_replicate", "efsdp"] if experts else None


def wrap_stage(model, config, c: Candidate, mesh, dp_mesh, expert_mesh=None):
    """Layout ``c``'s wrapping of ``model`` (:func:`build_stage`'s) on :func:`layout_mesh`'s
    meshes, in torchtitan's order: ``parallelize_module`` with the model's TP plan,
    ``checkpoint_wrapper`` per block (``c.ac``), ``fully_shard`` per block (a MoE's experts
    first, over ``expert_mesh``) and at the root with bf16 compute and fp32 reduction, resharding
    after the forward. The fake step and the real ranks (:mod:`course_lib.plan.real`) both call it."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    if c.tp > 1:
        _apply_tp(model, config, mesh["tp"])
    layers = model.model.layers
    if c.ac != "none":
        _apply_ac(layers, c.ac)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = True  # also with pp: the planner says "FSDP reshards after forward in every layout"
    for layer in layers:
        if expert_mesh is not None:
            for e in _experts(layer):
                fully_shard(e, mesh=expert_mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    return model


@dataclasses.dataclass
class StepPeaks:
    """What :func:`tracked_step` measured: the activations held after the forward, AdamW's
    moments, each phase's peak snapshot (``snaps``: forward with the loss, backward, optimizer
    step; the tracker's categories and ``"Total"``) and its per-factor peaks (``by_factor``)."""

    act: int
    moments: int
    snaps: dict
    by_factor: dict


def tracked_step(model, ids, x=None, *, last: bool = True, modes=(), factors=()) -> StepPeaks:
    """AdamW (``foreach=False``) on ``model``, its moments made as its first step makes them,
    then one training step on ``ids`` (or the hidden state ``x`` a later stage receives) tracked
    by chapter 03's ``FSDPTracker`` (:class:`_PlanTracker`: also the peaks with the sharded states
    × each of ``factors``); ``modes`` (dispatch modes: counters) are on for the step. Runs on
    whatever tensors it is given: fake (the planner) or real (:mod:`course_lib.plan.real`)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    tracker = _PlanTracker(model, opt, factors=factors)
    tracker.track_inputs((ids,) if x is None else (ids, x))
    with tracker:
        _make_states(model, opt, tracker)  # Adam's moments exist, as in every step after the first
        tracker.reset_mod_stats()
        _reset_peak(tracker)
        with contextlib.ExitStack() as stack:
            for m in modes:
                stack.enter_context(m)
            return StepPeaks(*_step(model, opt, ids, x, last, tracker))


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
