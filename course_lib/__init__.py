"""course_lib — the helpers behind the distributed-training course.

Notebooks import what would distract from the lesson from here; the package is laid out by
concept, one folder per chapter (see ``docs/architecture.md``). The names below are the course's
public API: keep them stable.

The names are loaded lazily (PEP 562): ``import course_lib`` costs almost nothing, and
``course_lib.measure_step`` imports :mod:`course_lib.memory.tracker` on first use, so a torchrun
worker that only needs ``init_distributed`` does not import every chapter (DDP and
torch._dynamo included). Plots and widgets (matplotlib, ipywidgets) live in the ``show``
modules, which the notebooks import themselves.
"""
from __future__ import annotations

import importlib
from typing import Any

from course_lib.common.deprecation import warn_renamed

# public name -> module that defines it, grouped by the chapter that teaches it
_EXPORTS: dict[str, str] = {}
for _module, _names in {
    # 00 launching ranks; exercises (every chapter)
    "launcher.launch": ["run", "RankError", "warm_up"],
    "launcher.torchrun": ["torchrun", "torchrun_command", "cluster_command", "init_distributed",
                          "TorchrunError"],
    "common.machine": ["usable_cores"],
    "exercises": ["Feedback", "check_choice", "check_close", "check_number", "check_true"],
    # 01 training memory
    "common.models": ["GPT", "GPTConfig", "MLP", "PRESETS", "param_count"],
    "memory.tracker": ["measure_step", "measure_inference"],
    "memory.report": ["MemoryReport"],
    # 02 data parallelism
    "data_parallel.collectives": ["show_collectives", "format_collectives"],
    "data_parallel.by_hand": ["broadcast_parameters", "average_gradients"],
    "data_parallel.measure": ["compare_ddp"],
    "data_parallel.buckets": ["DDPByHand"],
    # 03 sharding
    "sharding.measure": ["measure_distributed", "compare_strategies"],
    "sharding.strategies": ["STRATEGIES", "train_step", "train_rank_sharded"],
    "sharding.comm_counter": ["CommCounter"],
    "sharding.zero_by_hand": ["ShardedOptimizer"],
    "sharding.fsdp_by_hand": ["FSDPByHand", "fsdp_full_state_dict"],
    # 04 model parallelism
    "tensor_parallel.measure": ["measure_tp", "measure_tp_model"],
    "pipeline_parallel.measure": ["measure_pipeline", "bubble_formula", "torch_pipeline"],
    "pipeline_parallel.bubble": ["measure_bubble_sweep", "BubbleSweep"],
    "tensor_parallel.megatron": ["megatron_status", "compare_megatron", "megatron_layout"],
    # 05 communication and scaling
    "communication.benchmark": ["CollectiveResult", "benchmark_collectives", "busbw_factor",
                                "format_table", "memcopy_bandwidth"],
    "communication.ring": ["ring_all_reduce", "compare_ring"],
    "communication.alphabeta": ["AlphaBeta", "fit_alpha_beta", "fit_per_world",
                                "measure_all_reduce"],
    "communication.scaling": ["measure_scaling"],
    "communication.scaling_link": ["scaling_over_link"],
    "communication.whatif": ["LINKS", "predict_step", "whatif_table"],
    "communication.multinode": ["run_two_nodes"],
    "communication.link_sweep": ["link_sweep", "LinkSweepUnavailable"],
    # 06 fault tolerance
    "fault_tolerance.checkpoint": ["CheckpointError", "latest_checkpoint", "load_checkpoint",
                                   "save_checkpoint"],
    "fault_tolerance.interval": ["young_daly_interval"],
    "fault_tolerance.training": ["Fault"],
    # 07 before you distribute
    "finetuning.lora": ["LoRALinear", "add_lora", "lora_param_count"],
    "finetuning.quantize": ["QuantLinear", "quantize", "quantize_model"],
    "finetuning.planner": ["plan_finetuning"],
    # 08 DeepSpeed
    "deepspeed.engine": ["deepspeed_config", "run_zero_stages"],
    "deepspeed.load": ["deepspeed_status"],
    # 09 composing parallelisms
    "composition.measure": ["run_parallel"],
    "composition.layout": ["Layout"],
    # 10 debugging distributed runs
    "debugging.divergence": ["first_divergence"],
    "debugging.health": ["all_finite", "nonfinite_ranks", "step_times", "stragglers"],
    "debugging.oom": ["BudgetTracker", "OverBudget"],
    # every chapter: what each rank did, when (issue 36)
    "common.timeline": ["Timeline", "Span", "chrome_trace", "save_chrome_trace"],
    "common.show": ["plot_timeline"],
    # 11 communicating less
    "communicating_less.measure": ["compare_hooks", "compare_local_sgd"],
    "communicating_less.replicas": ["survive_a_failure"],
    # 12 capstone: train a GPT end to end
    "capstone.measure": ["train_gpt", "predict_run"],
}.items():
    for _name in _names:
        _EXPORTS[_name] = _module
del _module, _names, _name

# modules exported under their old flat names (``from course_lib import devices``)
_MODULES = {"devices": "launcher.devices", "progress": "launcher.progress",
            "zero": "sharding.formulas"}

# old public names -> their new ones (issue 51): still served, with a DeprecationWarning; a
# dotted one left the list (no notebook uses it) and is imported from its module. ``plan`` (now
# ``plan_finetuning``) was served one release and retired: ``course_lib.plan`` is the planner
# package of issue 58
_RENAMED = {"train_rank": "train_rank_sharded",
            "wrap": "sharding.strategies.wrap",
            # issue 61: chapter 05 reads overlap from a profiler trace; the shaped-link measurement
            # stays for the benchmarks (benchmarks/record_speed_lessons.py)
            "measure_overlap": "data_parallel.overlap.measure_overlap"}

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    """Import the defining module of a public name on first use (PEP 562)."""
    if name in _RENAMED:
        home, _, new = f"{__name__}.{_RENAMED[name]}".rpartition(".")
        warn_renamed(f"course_lib.{name}", f"{home}.{new}")
        return getattr(importlib.import_module(home), new)  # not cached: each use warns
    if name in _MODULES:
        value = importlib.import_module(f"course_lib.{_MODULES[name]}")
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(f"course_lib.{_EXPORTS[name]}"), name)
    else:
        raise AttributeError(f"module 'course_lib' has no attribute {name!r}")
    globals()[name] = value  # cache: the next access is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext course_lib``: the ``%%torchrun NPROC NAME.py`` cell magic
    (:mod:`course_lib.launcher.script_magic`)."""
    from course_lib.launcher import script_magic  # IPython's: only a notebook loads it
    script_magic.load_ipython_extension(ipython)
