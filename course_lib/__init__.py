"""course_lib — the helpers behind the distributed-training course.

Notebooks import what would distract from the lesson from here; each module holds one concept
(see ``docs/architecture.md``). The names below are the course's public API: keep them stable.
Plots and widgets (matplotlib, ipywidgets) are imported from their modules by the notebooks, not
here, so that every rank starts without them.
"""
from course_lib import devices
from course_lib.alphabeta import AlphaBeta, fit_alpha_beta, fit_per_world, measure_all_reduce
from course_lib.comm import (CollectiveResult, benchmark_collectives, busbw_factor, format_table,
                             memcopy_bandwidth)
from course_lib.exercises import Feedback, check_choice, check_close, check_number, check_true
from course_lib.launch import RankError, run, warm_up
from course_lib.memory import measure_inference, measure_step
from course_lib.memory_report import MemoryReport
from course_lib.models import GPT, MLP, PRESETS, GPTConfig, param_count
from course_lib.multinode import run_two_nodes
from course_lib.pipeline_measure import bubble_formula, measure_pipeline, torch_pipeline
from course_lib.ring import compare_ring, ring_all_reduce
from course_lib.scaling import measure_scaling
from course_lib.tp_check import measure_tp, measure_tp_model
from course_lib.torchrun import (TorchrunError, cluster_command, init_distributed, torchrun,
                                 torchrun_command)
from course_lib.whatif import LINKS, predict_step, whatif_table

__all__ = [
    # 00 launching ranks
    "devices", "run", "RankError", "warm_up",
    "torchrun", "torchrun_command", "cluster_command", "init_distributed", "TorchrunError",
    # exercises (every chapter)
    "Feedback", "check_choice", "check_close", "check_number", "check_true",
    # 01 training memory
    "GPT", "GPTConfig", "MLP", "PRESETS", "param_count", "measure_step", "measure_inference",
    "MemoryReport",
    # 04 model parallelism
    "measure_tp", "measure_tp_model", "measure_pipeline", "bubble_formula", "torch_pipeline",
    # 05 communication and scaling
    "CollectiveResult", "benchmark_collectives", "busbw_factor", "format_table",
    "memcopy_bandwidth", "ring_all_reduce", "compare_ring", "AlphaBeta", "fit_alpha_beta",
    "fit_per_world", "measure_all_reduce", "measure_scaling", "LINKS", "predict_step",
    "whatif_table", "run_two_nodes",
]
