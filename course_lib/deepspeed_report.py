"""Chapter 08's tables, widget and exercise check for DeepSpeed ZeRO memory.

Everything here *reads* results of :func:`course_lib.deepspeed_zero.run_zero_stages` (measured
by :func:`course_lib.deepspeed_memory.census`) and puts them next to the course's prediction
(:func:`~course_lib.deepspeed_memory.predict_deepspeed`), DeepSpeed's own estimators
(:func:`~course_lib.deepspeed_memory.deepspeed_estimate`) and torch's strategies measured by
chapter 3's instrument. Used by ``08_deepspeed_and_megatron``.
"""
from __future__ import annotations

from typing import Callable

import torch

from course_lib.deepspeed_memory import (CATEGORIES, deepspeed_estimate, largest_layer,
                                         predict_deepspeed)
from course_lib.models import GPT, GPTConfig, get_config, param_count
from course_lib.zero import param_shapes

__all__ = ["split_key_bias", "memory_rows", "memory_table", "estimate_table", "stage_breakdown",
           "deepspeed_widget", "check_fit_config", "fit_answer"]


def split_key_bias(params: dict[str, torch.Tensor], config: GPTConfig | str = "tiny"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(every parameter but the attention key biases, the key biases), each flattened.

    The key bias (``attn.qkv.bias[d:2d]``) gets an exactly-zero gradient in exact arithmetic —
    softmax ignores a constant added to a row of scores — so what reaches Adam is rounding noise
    that Adam turns into updates of up to ~lr per step, different for every summation order.
    Comparing DeepSpeed with DDP therefore needs two tolerances: one for these, one for the rest.
    """
    d = get_config(config).d_model if isinstance(config, str) else config.d_model
    rest, keys = [], []
    for name, value in params.items():
        if name.endswith("attn.qkv.bias"):
            keys.append(value[d:2 * d])
            rest += [value[:d], value[2 * d:]]
        else:
            rest.append(value.flatten())
    return torch.cat(rest), torch.cat(keys)


def _largest(config: GPTConfig) -> int:
    with torch.device("meta"):
        return largest_layer(GPT(config))


def _estimate(config: GPTConfig, stage: int, world: int) -> int | None:
    try:
        return deepspeed_estimate(param_count(config), _largest(config), stage, world)
    except ImportError:  # no DeepSpeed here: no estimator either
        return None


def memory_rows(result: dict, config: GPTConfig | str = "tiny", rank: int = 0) -> list[dict]:
    """One row per stage: measured / predicted model states at both moments, DS's estimate, torch's.

    ``measured`` is the larger of the two moments (after backward, after step): the model
    states a rank must have room for.
    """
    config = get_config(config)
    shapes = param_shapes(config)
    ranks = result["ranks"]
    mine = ranks[rank]
    world = mine["world_size"]
    rows = []
    for stage in sorted(k for k in mine if isinstance(k, int)):
        entry = mine[stage]
        bwd = entry["after_backward"]
        step = entry["after_step"]
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
                     f"{_num(r['predicted_step']):>10}   {r['torch_strategy']:>8} "
                     f"{r['torch_measured']:>10,} (fwd {r['torch_fwd']:,})")
    return "\n".join(lines)


def estimate_table(rows: list[dict]) -> str:
    """DeepSpeed's estimate vs the course's prediction vs the measurement (model states/rank)."""
    lines = [f"{'stage':>5} {'N':>2} {'DeepSpeed estimate':>19} {'course prediction':>18} "
             f"{'measured':>10}   closer"]
    for r in rows:
        est, pred, meas = r["ds_estimate"], r["predicted"], r["measured"]
        if est is None:
            closer = "(DeepSpeed has no estimator)"
        elif abs(pred - meas) < abs(est - meas):
            closer = "course"
        elif abs(pred - meas) == abs(est - meas):
            closer = "same"
        else:
            closer = "DeepSpeed"
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

    return widgets.interactive(show, stage=widgets.Dropdown(options=[0, 1, 2, 3], value=2),
                               world=widgets.Dropdown(options=sorted({first, 2, 4}), value=first))


def _need(shapes: list, stage: int, n_gpus: int) -> int:
    return max(predict_deepspeed(shapes, stage, n_gpus, moment=m)["model_states"]
               for m in ("backward", "step"))


def fit_answer(config: GPTConfig | str, n_gpus: int, gpu_bytes: float,
               headroom: float = 0.8, shapes: list | None = None) -> int | None:
    """The lowest ZeRO stage whose predicted model states fit ``headroom × gpu_bytes``."""
    shapes = shapes or param_shapes(get_config(config))
    return next((s for s in range(4) if _need(shapes, s, n_gpus) <= headroom * gpu_bytes), None)


def check_fit_config(ds_config: object, *, config: GPTConfig | str | list = "gpt-7b",
                     n_gpus: int = 8, gpu_bytes: float = 24e9,
                     headroom: float = 0.8) -> tuple[bool, str]:
    """Exercise check: does ``ds_config`` train ``config`` on ``n_gpus`` × ``gpu_bytes``?

    The config's ZeRO stage is "run" through the course's prediction (checked to the byte
    against the measurement in this chapter) at ``n_gpus`` ranks; its model states must stay
    below ``headroom`` of the GPU (the rest is for activations, buckets and the CUDA context),
    and no lower stage may fit (a lower stage communicates less). ``config`` may also be the
    list of parameter shapes (building the 7B model's shapes on "meta" takes seconds).
    Returns ``(passed, message)``.
    """
    if ds_config is None or ds_config is Ellipsis:
        return False, "not answered yet: replace `...` with your config dict and run the cell."
    if not isinstance(ds_config, dict):
        return False, ("a DeepSpeed config is a dict (the JSON file), "
                       f"got {type(ds_config).__name__}")
    micro = ds_config.get("train_micro_batch_size_per_gpu")
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        return False, "set \"train_micro_batch_size_per_gpu\" to a positive integer"
    stage = (ds_config.get("zero_optimization") or {}).get("stage", 0)
    if stage is None or stage is Ellipsis:
        return False, "not answered yet: replace `...` with a ZeRO stage and run the cell."
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        return False, f"the ZeRO stage must be 0, 1, 2 or 3, got {stage!r}"
    shapes = config if isinstance(config, list) else param_shapes(get_config(config))
    need = _need(shapes, stage, n_gpus)
    limit = headroom * gpu_bytes
    if need > limit:
        return False, (f"stage {stage} needs {need / 1e9:.1f} GB of model states per GPU, more "
                       f"than {headroom:.0%} of {gpu_bytes / 1e9:g} GB")
    if fit_answer(config, n_gpus, gpu_bytes, headroom, shapes) != stage:
        return False, (f"stage {stage} fits ({need / 1e9:.1f} GB per GPU), but a lower stage "
                       "fits too and communicates less")
    return True, f"stage {stage}: {need / 1e9:.1f} GB of model states per GPU — it fits"
