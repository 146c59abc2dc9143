"""course_lib — the helpers behind the distributed-training course.

Notebooks import what would distract from the lesson from here; each module holds one concept
(see ``docs/architecture.md``). The names below are the course's public API: keep them stable.
"""
from course_lib import devices
from course_lib.exercises import Feedback, check_choice, check_close, check_number, check_true
from course_lib.launch import RankError, run, warm_up
from course_lib.torchrun import (TorchrunError, cluster_command, init_distributed, torchrun,
                                 torchrun_command)

__all__ = [
    "devices", "run", "RankError", "warm_up",
    "torchrun", "torchrun_command", "cluster_command", "init_distributed", "TorchrunError",
    "Feedback", "check_choice", "check_close", "check_number", "check_true",
]
