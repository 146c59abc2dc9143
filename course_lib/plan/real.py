"""Check the planner on your own machine: a layout's training step run for real, on CPU ranks.

:func:`measure_real` starts ``layout.world`` ranks with the course's launcher (gloo), each building
transformers' model for the config with real tensors (fp32 master weights, one seed), wrapping it
with the planner's own recipe (:mod:`course_lib.plan.recipe`) and running one tracked step; each
rank answers its peak in each phase (:class:`RealRun`), :func:`compare` sets them beside
the plan. Pipeline, context and expert parallelism are refused: the planner models them (a stage
plus 1F1B's stash by arithmetic; ``S / cp`` tokens with no K/V ring; ``experts / ep`` experts fed
by balanced routing with no all-to-all), so no real program runs the same. docs/modules/plan.md.
"""
from __future__ import annotations

import dataclasses
import gc
import warnings

import torch

from course_lib.launcher.by_name import ByName
from course_lib.launcher.launch import run
from course_lib.plan.layouts import Candidate
from course_lib.plan.models import build_stage, load_config, model_spec
from course_lib.plan.recipe import forget_meshes, layout_mesh, tracked_step, wrap_stage

__all__ = ["RealRun", "validate_real", "measure_real", "rank_peaks", "compare"]

_RANKS = ByName("course_lib.plan.real", "rank_peaks")


@dataclasses.dataclass
class RealRun:
    """One real rank's step: ``phases`` (peak bytes of each phase, as the planner's
    ``StageRun.phases``), their maximum and the tracker's categories at that peak."""

    rank: int
    phases: dict
    peak: int
    categories: dict


def validate_real(config, layouts: list[Candidate], global_batch: int, seq_len: int) -> None:
    """A ``ValueError`` (or the config's ``ConfigError``) saying why, before any process starts."""
    spec = model_spec(config)
    for name, value in (("global_batch", global_batch), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not layouts:
        raise ValueError("no layout to run")
    for c in layouts:
        if not isinstance(c, Candidate):
            raise ValueError(f"a layout is a course_lib.plan.layouts.Candidate, got {c!r}")
        modelled = [n for n in ("pp", "cp", "ep") if getattr(c, n) > 1]
        if modelled:
            raise ValueError(f"{c.label}: {', '.join(modelled)} > 1 is modelled by the planner, not "
                             "run: nothing real runs the same program (course_lib.plan.real)")
        if global_batch % c.dp:
            raise ValueError(f"{c.label}: global_batch {global_batch} does not split over its "
                             f"{c.dp} data-parallel ranks")
        if spec.heads % c.tp or spec.kv_heads % c.tp or spec.ffn % c.tp:
            raise ValueError(f"{c.label}: tp {c.tp} must divide the attention heads ({spec.heads}), "
                             f"the key/value heads ({spec.kv_heads}) and the MLP ({spec.ffn})")
    if spec.moe:
        raise ValueError("a mixture of experts routes tokens by its router: only dense models run "
                         "here (the planner's MoE rows assume balanced routing)")


def measure_real(model, layouts: Candidate | list[Candidate], *, global_batch: int, seq_len: int,
                 seed: int = 0, timeout: float = 300.0) -> dict[Candidate, list[RealRun]]:
    """Each layout's step on ``layout.world`` real CPU ranks: ``{layout: [RealRun per rank]}``.

    ``model``: what :func:`course_lib.plan.plan` takes (a stored name, a config.json, a dict, a
    transformers config), built whole (all its layers: keep it small). ``global_batch``
    sequences of ``seq_len`` tokens, split over each layout's data-parallel ranks. Layouts of
    the same size run in one launch, one after the other.
    """
    config = load_config(model)
    layouts = [layouts] if isinstance(layouts, Candidate) else list(layouts)
    validate_real(config, layouts, global_batch, seq_len)
    out = {}
    for world in dict.fromkeys(c.world for c in layouts):
        group = [c for c in layouts if c.world == world]
        results = run(_RANKS, world, config, group, global_batch, seq_len, seed,
                      timeout=timeout, threads=1, device="cpu")
        for i, c in enumerate(group):
            out[c] = [r[i] for r in results]
    return out


def rank_peaks(config, layouts: list[Candidate], global_batch: int, seq_len: int,
               seed: int) -> list[RealRun]:
    """What each rank of :func:`measure_real` runs: every layout's step in turn."""
    import torch.distributed as dist
    out = []
    for c in layouts:
        gc.collect()
        forget_meshes()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mesh, dp_mesh, _ = layout_mesh(c, False)
            torch.manual_seed(seed)  # the same weights on every rank
            model = build_stage(config, config.num_hidden_layers, seq_len=seq_len)
            wrap_stage(model, config, c, mesh, dp_mesh)
            replica, shard = dp_mesh.get_coordinate()
            gen = torch.Generator().manual_seed(seed * 1_000_003 + replica * c.dp_shard + shard)
            ids = torch.randint(0, config.vocab_size, (global_batch // c.dp, seq_len), generator=gen)
            step = tracked_step(model, ids)
        phases = {k: snap["Total"] for k, snap in step.snaps.items()}
        top = max(phases, key=phases.get)
        out.append(RealRun(dist.get_rank(), phases, phases[top],
                           {str(getattr(k, "value", k)): v for k, v in step.snaps[top].items()}))
        del model, step
    return out


def compare(planned, runs: list[RealRun]) -> str:
    """A table: the planner's peak (a ``StageRun``) beside each real rank's, and how far off."""
    lines = [f"{'rank':>4} {'phase':>9} {'planned B':>13} {'real B':>13} {'off':>7}"]
    for r in runs:
        for phase in (k for k in r.phases if k in planned.phases):
            p, m = planned.phases[phase], r.phases[phase]
            lines.append(f"{r.rank:>4} {phase:>9} {p:>13,} {m:>13,} {p / m - 1:+7.2%}")
    return "\n".join(lines)
