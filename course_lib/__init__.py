"""course_lib — the helpers behind the distributed-training course.

Notebooks import what would distract from the lesson from here; each module holds one concept
(see ``docs/architecture.md``). The names below are the course's public API: keep them stable.

The names are loaded lazily (PEP 562): ``import course_lib`` costs almost nothing, and
``course_lib.measure_step`` imports :mod:`course_lib.memory` on first use. A torchrun worker
that only needs ``init_distributed`` then starts seconds sooner (importing every chapter's
module, DDP and torch._dynamo included, took ~4 s per process on 2 cores). Plots and widgets
(matplotlib, ipywidgets) are imported from their own modules by the notebooks.
"""
from __future__ import annotations

import importlib
from typing import Any

# Eager on purpose: the function ``course_lib.torchrun`` shares its name with its module, and a
# lazy name would be replaced by the module as soon as anything imported the submodule.
from course_lib.torchrun import torchrun  # noqa: E402
# The same for ``course_lib.link_sweep`` (a light module: torch is imported only when it runs).
# Get the module itself with ``importlib.import_module("course_lib.link_sweep")``.
from course_lib.link_sweep import link_sweep  # noqa: E402

# public name -> module that defines it, grouped by the chapter that teaches it
_EXPORTS: dict[str, str] = {}
for _module, _names in {
    # 00 launching ranks; exercises (every chapter)
    "launch": ["run", "RankError", "warm_up"],
    "torchrun": ["torchrun_command", "cluster_command", "init_distributed", "TorchrunError"],
    "exercises": ["Feedback", "check_choice", "check_close", "check_number", "check_true"],
    # 01 training memory
    "models": ["GPT", "GPTConfig", "MLP", "PRESETS", "param_count"],
    "memory": ["measure_step", "measure_inference"],
    "memory_report": ["MemoryReport"],
    # 02 data parallelism
    "collectives": ["show_collectives", "format_collectives"],
    "ddp": ["broadcast_parameters", "average_gradients", "compare_ddp"],
    # 03 sharding
    "distributed_memory": ["measure_distributed", "compare_strategies"],
    "strategies": ["STRATEGIES", "wrap", "train_step", "train_rank"],
    "comm_count": ["CommCounter"],
    # 04 model parallelism
    "tp_check": ["measure_tp", "measure_tp_model"],
    "pipeline_measure": ["measure_pipeline", "bubble_formula", "torch_pipeline"],
    "megatron_tp": ["megatron_status", "compare_megatron", "megatron_layout"],
    # 05 communication and scaling
    "comm": ["CollectiveResult", "benchmark_collectives", "busbw_factor", "format_table",
             "memcopy_bandwidth"],
    "ring": ["ring_all_reduce", "compare_ring"],
    "alphabeta": ["AlphaBeta", "fit_alpha_beta", "fit_per_world", "measure_all_reduce"],
    "scaling": ["measure_scaling"],
    "whatif": ["LINKS", "predict_step", "whatif_table"],
    "multinode": ["run_two_nodes"],
    "link_sweep": ["link_sweep", "LinkSweepUnavailable"],
    # 06 fault tolerance
    "checkpoint": ["CheckpointError", "latest_checkpoint", "load_checkpoint", "save_checkpoint"],
    "checkpoint_interval": ["young_daly_interval"],
    "fault_training": ["Fault"],
    # 07 before you distribute
    "lora": ["LoRALinear", "add_lora", "lora_param_count"],
    "quantize": ["QuantLinear", "quantize", "quantize_model"],
    "planner": ["plan"],
    # 08 DeepSpeed
    "deepspeed_zero": ["deepspeed_config", "deepspeed_status", "run_zero_stages"],
}.items():
    for _name in _names:
        _EXPORTS[_name] = _module
del _module, _names, _name

__all__ = sorted(_EXPORTS) + ["devices", "progress", "torchrun", "zero"]


def __getattr__(name: str) -> Any:
    """Import the defining module of a public name on first use (PEP 562)."""
    if name in ("devices", "progress", "zero"):
        return importlib.import_module(f"course_lib.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"course_lib.{_EXPORTS[name]}"), name)
        globals()[name] = value  # cache: the next access is an ordinary attribute
        return value
    raise AttributeError(f"module 'course_lib' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
