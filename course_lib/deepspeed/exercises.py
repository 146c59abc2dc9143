"""Chapter 08's exercise checks: a learner's DeepSpeed config, on paper and on real ranks.

:func:`deepspeed_prediction` is exercise 1's value; :func:`check_fit_config` "runs" a config for a 7B model through the course's prediction;
:func:`check_ds_config` runs a learner's config through ``deepspeed.initialize`` on real ranks
and compares the bytes each rank holds with the prediction for ZeRO-2 in bf16.
"""
from __future__ import annotations

import math

from typing import Callable

from course_lib.common.checks import is_int
from course_lib.common.models import GPTConfig, get_config
from course_lib.deepspeed.holdings import CATEGORIES, predict_deepspeed
from course_lib.deepspeed.load import deepspeed_status
from course_lib.launcher.launch import run
from course_lib.sharding.formulas import param_shapes

__all__ = ["check_fit_config", "fit_answer", "check_ds_config", "check_stage3_bytes",
           "deepspeed_prediction", "TASK"]


def _need(shapes: list, stage: int, n_gpus: int) -> int:
    return max(predict_deepspeed(shapes, stage, n_gpus, moment=m)["model_states"]
               for m in ("backward", "step"))


def deepspeed_prediction(stage: int, world: int, config: GPTConfig | str = "tiny",
                         moment: str = "step") -> int:
    """Exercise 1's value: rank 0's model-state bytes under ZeRO ``stage`` on ``world`` ranks
    (fp32, torch's Adam, ``reduce_bucket_size`` 2**14), by the course's prediction, which the
    chapter checks against DeepSpeed's own tensors at N = 2 (the widget measures N = 4)."""
    return predict_deepspeed(param_shapes(get_config(config)), stage, world,
                             moment=moment)["model_states"]


def check_stage3_bytes(answer: object):
    """Exercise 1: rank 0's model-state bytes after the step, ZeRO-3 on 4 ranks (within 0.1 %)."""
    from course_lib.exercises import check_number
    return check_number(answer, deepspeed_prediction(stage=3, world=4), rtol=1e-3,
                        name="ZeRO-3 with DeepSpeed, N = 4", unit="bytes",
                        hint="which categories are divided by N, and which one is not?")


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
    and no lower stage may fit (stage 3 moves 3Ψ per step, stages 0-2 move 2Ψ: ZeRO §7).
    ``config`` may also be the list of parameter shapes (building the 7B model's shapes on
    "meta" takes seconds).
    Returns ``(passed, message)``.
    """
    if ds_config is None or ds_config is Ellipsis:
        return False, "not answered yet: replace `...` with your config dict and run the cell."
    if not isinstance(ds_config, dict):
        return False, ("a DeepSpeed config is a dict (the JSON file), "
                       f"got {type(ds_config).__name__}")
    micro = ds_config.get("train_micro_batch_size_per_gpu")
    if not is_int(micro) or micro < 1:
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
                       "fits too: take the lowest that fits (stage 3 moves 3Ψ per step, "
                       "stages 0-2 move 2Ψ)")
    return True, f"stage {stage}: {need / 1e9:.1f} GB of model states per GPU — it fits"


#: The task of :func:`check_ds_config`: ZeRO-2, bf16, 16 sequences per step in 2 micro-batches.
TASK = {"stage": 2, "dtype": "torch.bfloat16", "global_batch": 16, "accum": 2}
_MOMENTS = {"accumulate": "after the first micro-batch of a step",
            "backward": "after the last micro-batch's backward", "step": "after the step"}


def _batch_problem(micro: int, accum: int, global_batch: int, world: int) -> str | None:
    if accum != TASK["accum"] or global_batch != TASK["global_batch"]:
        return (f"on {world} ranks the engine trains {global_batch} sequences per optimizer "
                f"step, in {accum} micro-batch(es) of {micro} per rank; the task asks for "
                f"{TASK['global_batch']} per step, accumulated over {TASK['accum']} micro-batches")
    return None


def _bytes_problem(got: dict, world: int, bucket: int, stage: int) -> str | None:
    """What differs from ZeRO-2 in bf16, said in bytes (rank 0), or None."""
    shapes = param_shapes(get_config("tiny"))
    psi = sum(math.prod(s) for s in shapes)
    for moment, when in _MOMENTS.items():
        want = predict_deepspeed(shapes, TASK["stage"], world, moment=moment,
                                 bucket_elements=bucket, precision="bf16")
        have = got[moment]
        if have == want:
            continue
        if stage == 3:
            return (f"{when}, rank 0 holds {have['params']:,} bytes of weights for {psi:,} "
                    "parameters, partitions of every tensor plus what it gathered: the "
                    "parameters are partitioned; this task keeps the full 16-bit weights on "
                    "every rank")
        if have["optimizer"] >= 8 * psi:
            return (f"{when}, rank 0 holds Adam's moments for all {psi:,} parameters "
                    f"({have['optimizer']:,} bytes): the optimizer states are not partitioned")
        if have["grads"] >= 2 * psi:
            return (f"{when}, rank 0 holds {have['grads']:,} bytes of gradients, the full "
                    f"gradient of all {psi:,} parameters: while accumulating, this task keeps "
                    "only the rank's partition of the gradients")
        diff = [f"{c} {have[c]:,} (predicted {want[c]:,})" for c in CATEGORIES
                if have[c] != want[c]]
        return f"{when}, rank 0's bytes differ from the ZeRO-2 bf16 prediction: " + \
            ", ".join(diff)
    return None


def check_ds_config(make_config: Callable[[int], dict], world: int = 2) -> tuple[bool, str]:
    """Run the learner's ``make_config(world)`` on ``world`` real ranks; compare with :data:`TASK`.

    The config goes through ``deepspeed.initialize`` in every rank (its errors are DeepSpeed's
    own), trains the tiny GPT 2 optimizer steps, and :func:`course_lib.deepspeed.holdings.holdings`
    counts rank 0's bytes after the first micro-batch of the second step, after its last
    backward and after its step; they must equal :func:`predict_deepspeed` for ZeRO-2 in bf16
    at each moment (stage 1 holds the same bytes as stage 2 except while accumulating, hence
    the first moment). Returns ``(passed, message)`` for :func:`course_lib.check_true`.
    """
    if not callable(make_config):
        raise TypeError("pass your function itself (no parentheses), "
                        f"got {type(make_config).__name__}")
    ds_config = make_config(world)
    if not isinstance(ds_config, dict):
        return False, f"your function returns a {type(ds_config).__name__}, not a config dict"
    zero = ds_config.get("zero_optimization") or {}
    bucket = zero.get("reduce_bucket_size", 5e8) if isinstance(zero, dict) else 5e8
    if not is_int(bucket) or not 0 < bucket <= 2**20:
        return False, ("set \"reduce_bucket_size\" in \"zero_optimization\" to at most 2**20 "
                       "elements (DeepSpeed's default, 5e8, allocates a 1 GB bf16 buffer)")
    ok, reason = deepspeed_status()
    if not ok:
        return False, reason
    from course_lib.deepspeed import ranks  # DeepSpeed is imported already (status)
    got = run(ranks.config_census, world, ds_config, timeout=120, threads=1)[0]
    if "error" in got:
        return False, f"DeepSpeed refused the config: {got['error']}"
    problem = _batch_problem(got["micro"], got["accum"], got["train_batch"], world)
    if problem is None and got["dtype"] != TASK["dtype"]:
        problem = (f"rank 0's weights are {got['dtype'].replace('torch.', '')}: this task "
                   "trains with 16-bit weights and fp32 master weights (mixed precision)")
    problem = problem or _bytes_problem(got, world, bucket, got["stage"])
    if problem:
        return False, problem + "."
    other = make_config(2 * world)  # the same config for twice the ranks: no hard-coded world
    micro = other.get("train_micro_batch_size_per_gpu") if isinstance(other, dict) else None
    if not is_int(micro) or micro * other.get("gradient_accumulation_steps", 1) * 2 * world \
            != TASK["global_batch"]:
        return False, (f"for {2 * world} ranks your function's config does not train "
                       f"{TASK['global_batch']} sequences per step: use world_size")
    return True, (f"on {world} ranks: ZeRO-2, bf16, {got['train_batch']} sequences per step; "
                  f"rank 0's bytes equal the prediction at all three moments "
                  f"({got['backward']['model_states']:,} after backward)")
