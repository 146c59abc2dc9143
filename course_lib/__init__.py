"""course_lib — the helpers behind the distributed-training course.

Notebooks import what would distract from the lesson from here; each module holds one concept
(see ``docs/architecture.md``). The names below are the course's public API: keep them stable.
Plots and widgets (matplotlib, ipywidgets) are imported from their modules by the notebooks, not
here, so that every rank starts without them.
"""
from course_lib import devices
from course_lib.exercises import Feedback, check_choice, check_close, check_number, check_true
from course_lib.launch import RankError, run, warm_up
from course_lib.memory import measure_inference, measure_step
from course_lib.memory_report import MemoryReport
from course_lib.models import GPT, MLP, PRESETS, GPTConfig, param_count
from course_lib.torchrun import (TorchrunError, cluster_command, init_distributed, torchrun,
                                 torchrun_command)

__all__ = [
    # 00 launching ranks
    "devices", "run", "RankError", "warm_up",
    "torchrun", "torchrun_command", "cluster_command", "init_distributed", "TorchrunError",
    # exercises (every chapter)
    "Feedback", "check_choice", "check_close", "check_number", "check_true",
    # 01 training memory
    "GPT", "GPTConfig", "MLP", "PRESETS", "param_count", "measure_step", "measure_inference",
    "MemoryReport",
]
