"""Chapter 08's exercise check: does a learner's DeepSpeed config fit the GPUs it names?"""
from __future__ import annotations

from course_lib.common.checks import is_int
from course_lib.common.models import GPTConfig, get_config
from course_lib.deepspeed.census import predict_deepspeed
from course_lib.sharding.formulas import param_shapes

__all__ = ["check_fit_config", "fit_answer"]


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
                       "fits too and communicates less")
    return True, f"stage {stage}: {need / 1e9:.1f} GB of model states per GPU — it fits"
