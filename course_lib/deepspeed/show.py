"""Chapter 08's tables and widget for DeepSpeed ZeRO memory.

Everything here *reads* results of :func:`course_lib.deepspeed.engine.run_zero_stages` (measured
by :func:`course_lib.deepspeed.holdings.holdings`) and puts them next to the course's prediction,
DeepSpeed's own estimators and torch's strategies measured by chapter 3's instrument.
"""
from __future__ import annotations

from typing import Callable

import torch

from course_lib.common.models import GPT, GPTConfig, get_config, param_count
from course_lib.deepspeed.holdings import (CATEGORIES, deepspeed_estimate, largest_layer,
                                           predict_deepspeed)
from course_lib.display import COLORS, DPI, FONT_MIN, GREY, PALETTE, WIDGET_STYLE
from course_lib.memory.predict import bytes_per_param
from course_lib.sharding.formulas import paper_bytes, param_shapes
from course_lib.common.plots import legible

__all__ = ["memory_rows", "memory_table", "estimate_table", "stage_breakdown", "deepspeed_widget",
           "precision_rows", "precision_table", "plot_stage_holdings", "offload_table"]


def _largest(config: GPTConfig) -> int:
    with torch.device("meta"):
        return largest_layer(GPT(config))


def _estimate(config: GPTConfig, stage: int, world: int) -> int | None:
    try:
        return deepspeed_estimate(param_count(config), _largest(config), stage, world)
    except ImportError:  # no DeepSpeed here: no estimator either
        return None


#: (config choice, ZeRO stage, ``offload`` of :func:`deepspeed_estimate`) — the rows of the offload table
OFFLOAD_CHOICES = (("stage 2", 2, "none"),
                   ('stage 2 + "offload_optimizer"', 2, "optimizer"),
                   ("stage 3", 3, "none"),
                   ('stage 3 + "offload_optimizer"', 3, "optimizer"),
                   ('stage 3 + "offload_optimizer" + "offload_param"', 3, "optimizer+params"))


def offload_table(config: GPTConfig | str = "gpt-7b", n_gpus: int = 8) -> str:
    """DeepSpeed's own per-GPU model-state estimate for each offload choice (its estimator
    functions, mixed precision); built on the "meta" device, nothing allocated. ``""`` without
    DeepSpeed."""
    config = get_config(config)
    psi, largest = param_count(config), _largest(config)
    try:
        rows = [(name, deepspeed_estimate(psi, largest, stage, n_gpus, offload))
                for name, stage, offload in OFFLOAD_CHOICES]
    except ImportError:
        return ""
    width = max(len(name) for name, _ in rows)
    lines = [f"{psi / 1e9:.2f}B parameters on {n_gpus} GPUs — DeepSpeed's estimate of the model "
             f"states per GPU (GB)"]
    lines += [f"{name:<{width}}  {gpu / 1e9:6.1f}" for name, gpu in rows]
    return "\n".join(lines)


def memory_rows(result: dict, config: GPTConfig | str = "tiny", rank: int = 0) -> list[dict]:
    """One row per stage: measured / predicted model states at both moments, DS's estimate, torch's.

    ``measured`` is the larger of the two moments (after backward, after step): the model
    states a rank must have room for.
    """
    config = get_config(config)
    shapes = param_shapes(config)
    mine = result["ranks"][rank]
    world = mine["world_size"]
    rows = []
    for stage in sorted(k for k in mine if isinstance(k, int)):
        bwd, step = mine[stage]["after_backward"], mine[stage]["after_step"]
        pred_b = predict_deepspeed(shapes, stage, world, rank=rank, moment="backward")
        pred_s = predict_deepspeed(shapes, stage, world, rank=rank)
        torch_row = mine["torch"][stage]
        rows.append({
            "stage": stage, "world": world, "engine": result["engine"],
            "measured_backward": bwd["model_states"] if bwd else None,
            "measured_step": step["model_states"],
            "measured": max(step["model_states"], bwd["model_states"] if bwd else 0),
            "predicted_backward": pred_b["model_states"], "predicted_step": pred_s["model_states"],
            "predicted": max(pred_b["model_states"], pred_s["model_states"]),
            "ds_estimate": _estimate(config, stage, world),
            "torch_strategy": torch_row["strategy"], "torch_measured": torch_row["model_states"],
            "torch_fwd": torch_row["model_states_fwd"],
        })
    return rows


def _num(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def memory_table(rows: list[dict]) -> str:
    """Per-rank model-state bytes: DeepSpeed measured vs predicted at both moments, torch's."""
    head = (f"{'stage':>5} {'after backward':>15} {'predicted':>10} {'after step':>11} "
            f"{'predicted':>10}   {'torch equivalent (measured)':>28}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['stage']:>5} {_num(r['measured_backward']):>15} "
                     f"{_num(r['predicted_backward']):>10} {_num(r['measured_step']):>11} "
                     f"{_num(r['predicted_step']):>10}   {r['torch_strategy']:>15} "
                     f"{r['torch_measured']:>10,} (fwd {r['torch_fwd']:,})")
    return "\n".join(lines)


def estimate_table(rows: list[dict]) -> str:
    """DeepSpeed's estimate vs the course's prediction vs the measurement (model states/rank)."""
    lines = [f"{'stage':>5} {'N':>2} {'DeepSpeed estimate':>19} {'course prediction':>18} "
             f"{'measured':>10}   closer"]
    for r in rows:
        est, pred, meas = r["ds_estimate"], r["predicted"], r["measured"]
        lead = None if est is None else abs(est - meas) - abs(pred - meas)  # > 0: course closer
        closer = ("(DeepSpeed has no estimator)" if lead is None else "course" if lead > 0
                  else "same" if lead == 0 else "DeepSpeed")
        lines.append(f"{r['stage']:>5} {r['world']:>2} {_num(est):>19} {pred:>18,} "
                     f"{meas:>10,}   {closer}")
    return "\n".join(lines)


def stage_breakdown(result: dict, stage: int, rank: int = 0,
                    config: GPTConfig | str = "tiny") -> str:
    """Per category, what the census measured vs what the course predicts, for one stage."""
    config = get_config(config)
    mine = result["ranks"][rank]
    world = mine["world_size"]
    entry = mine[stage]
    lines = [f"ZeRO stage {stage}, N = {world}, rank {rank} ({result['engine']}: "
             f"{entry['optimizer']}) — bytes",
             f"{'category':>12} {'after backward':>15} {'predicted':>10} {'after step':>11} "
             f"{'predicted':>10}"]
    pred_b = predict_deepspeed(param_shapes(config), stage, world, rank=rank, moment="backward")
    pred_s = predict_deepspeed(param_shapes(config), stage, world, rank=rank)
    bwd = entry["after_backward"] or {}
    for key in CATEGORIES + ("model_states",):
        lines.append(f"{key:>12} {_num(bwd.get(key)):>15} {pred_b[key]:>10,} "
                     f"{entry['after_step'][key]:>11,} {pred_s[key]:>10,}")
    est = _estimate(config, stage, world)
    torch_row = mine["torch"][stage]
    lines.append(f"DeepSpeed's estimator: {_num(est)}; torch's {torch_row['strategy']} "
                 f"(chapter 3, measured after step): {torch_row['model_states']:,}")
    return "\n".join(lines)


def precision_rows(fp32: dict, bf16: dict, config: GPTConfig | str = "tiny",
                   rank: int = 0) -> list[dict]:
    """Per stage, rank ``rank`` after backward: the bf16 census next to its predictions.

    ``bf16`` is a run with ``"bf16": {"enabled": true}`` (``{"ranks": [...]}``), ``fp32`` the
    chapter's fp32 run; ``predicted`` is :func:`predict_deepspeed` with ``precision="bf16"``,
    ``paper`` the ZeRO paper's formula (:func:`course_lib.sharding.formulas.paper_bytes`, K = 12).
    """
    config = get_config(config)
    shapes = param_shapes(config)
    psi = param_count(config)
    mine = bf16["ranks"][rank]
    world = mine["world_size"]
    paper = paper_bytes(psi, world, k=12)
    paper_stage = ("ddp", "zero1", "zero2", "fsdp")  # the paper's names: its ZeRO-2 keeps whole weights
    rows = []
    for stage in sorted(k for k in mine if isinstance(k, int)):
        rows.append({"stage": stage, "world": world, "psi": psi,
                     "measured": mine[stage]["after_backward"],
                     "predicted": predict_deepspeed(shapes, stage, world, rank=rank,
                                                    moment="backward", precision="bf16"),
                     "paper": paper[paper_stage[stage]],
                     "fp32": fp32["ranks"][rank][stage]["after_backward"]})
    return rows


def precision_table(rows: list[dict]) -> str:
    """bf16 bytes per category (after backward) vs the prediction, the paper's formula and fp32."""
    if not rows:
        return "no bf16 measurement"
    per = bytes_per_param("mixed")
    r0 = rows[0]
    lines = [f"bf16 mixed precision, Ψ = {r0['psi']:,} parameters, N = {r0['world']}, rank 0, "
             "after backward — bytes",
             f"course_lib.memory's precision=\"mixed\": {per['params']} + {per['grads']} + "
             f"{per['optimizer']} = {per['total']} B/param (weights + grads + master and Adam)",
             f"{'stage':>5} {'params':>8} {'grads':>8} {'master':>8} {'Adam':>9} "
             f"{'buckets+other':>13} {'total':>10} {'= predicted':>11} {'B/param':>7} "
             f"{'paper (K=12)':>12} {'fp32 total':>10}"]
    for r in rows:
        m = r["measured"]
        lines.append(f"{r['stage']:>5} {m['params']:>8,} {m['grads']:>8,} {m['master']:>8,} "
                     f"{m['optimizer']:>9,} {m['buckets'] + m['other']:>13,} "
                     f"{m['model_states']:>10,} {str(m == r['predicted']):>11} "
                     f"{m['model_states'] / r['psi']:>7.2f} {r['paper']:>12,.0f} "
                     f"{r['fp32']['model_states']:>10,}")
    return "\n".join(lines)


def deepspeed_widget(result: dict, measure: Callable[[int], dict] | None = None):
    """Dropdowns over stage and world size → :func:`stage_breakdown`.

    ``result`` answers its own world size at once; another world size calls ``measure(world)``
    (e.g. ``lambda n: run_zero_stages(nprocs=n)``: a launch, tens of seconds) once and keeps it.
    """
    import ipywidgets as widgets

    first = result["ranks"][0]["world_size"]
    cache = {first: result}

    def show(stage: int = 2, world: int = first) -> None:
        if world not in cache:
            if measure is None:
                print(f"no measurement for N = {world}")
                return
            cache[world] = measure(world)
        print(stage_breakdown(cache[world], stage))

    return widgets.interactive(show, stage=widgets.Dropdown(options=[0, 1, 2, 3], value=2,
                                                            style=WIDGET_STYLE),
                               world=widgets.Dropdown(options=sorted({first, 2, 4}), value=first,
                                                      style=WIDGET_STYLE))


@legible
def plot_stage_holdings(result: dict, moment: str = "after_backward"):
    """One panel per ZeRO stage, one stacked bar per rank: the bytes the census found in that
    rank's engine, per category, at ``moment`` (``"after_backward"`` or ``"after_step"``).

    The dotted line is stage 0's total divided by N: what a rank would hold if *everything* were
    partitioned. matplotlib is imported on call (this module's tables are used without it)."""
    import matplotlib.pyplot as plt

    colours = {**COLORS, "master": PALETTE[4], "buckets": PALETTE[6], "other": GREY}
    ranks = result["ranks"]
    world = ranks[0]["world_size"]
    stages = sorted(k for k in ranks[0] if isinstance(k, int))
    fig, axes = plt.subplots(1, len(stages), figsize=(7.0, 3.6), dpi=DPI, sharey=True,
                             squeeze=False)
    used = []
    for ax, stage in zip(axes[0], stages):
        bottoms = [0.0] * world
        for category in CATEGORIES:
            heights = [(r[stage][moment] or {}).get(category, 0) / 1e6 for r in ranks]
            if not any(heights):
                continue
            ax.bar(range(world), heights, bottom=bottoms, color=colours[category], width=0.7,
                   label=category if category not in used else None)
            used.append(category)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        if 0 in stages:
            everything = (ranks[0][0][moment] or {}).get("model_states", 0) / 1e6 / world
            ax.axhline(everything, color="black", ls=":", lw=1.5,
                       label="stage 0 ÷ N" if stage == stages[0] else None)
        ax.set_title(f"stage {stage}", fontsize=FONT_MIN)
        ax.set_xticks(range(world), [f"r{r}" for r in range(world)], fontsize=FONT_MIN)
    axes[0, 0].set_ylabel("model states (MB)", fontsize=FONT_MIN)
    fig.supxlabel(f"rank (N = {world}), bytes {moment.replace('_', ' ')}", fontsize=FONT_MIN)
    fig.legend(loc="upper center", ncol=4, fontsize=FONT_MIN, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.82))
    return fig
