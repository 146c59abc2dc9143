"""Record the speed lessons' runs (chapters 02, 04, 05, 09) into data/speed_lessons.json.

Where a notebook cannot run them (one usable core, no network namespaces), it shows these,
labelled with this machine, the date and the load. Run as root, or where unprivileged user
namespaces work, on a machine with 2 free cores, from the repository root:

    python benchmarks/record_speed_lessons.py            # every experiment
    python benchmarks/record_speed_lessons.py overlap    # one of: overlap, scaling, bubble, order
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch

from course_lib.common import machine
from course_lib.common.recorded import SPEED_PATH, cpu_model
from course_lib.communication.scaling_link import (format_scaling_link, scaling_over_link,
                                                    scaling_verdict)
from course_lib.data_parallel.overlap import measure_overlap, overlap_verdict
from course_lib.pipeline_parallel.bubble import measure_bubble_sweep, sweep_record
from course_lib.pipeline_parallel.torch_schedules import (measure_torch_schedules, order_record,
                                                          order_verdict)


def _priority() -> int:
    """This process's nice value, plus its scheduler autogroup's (Linux: sessions are weighed
    against each other by the autogroup's nice, tasks inside one by their own)."""
    try:
        with open("/proc/self/autogroup") as f:
            group = int(f.read().split("nice")[1])
    except (OSError, IndexError, ValueError):
        group = 0
    return os.nice(0) + group


def machine_meta(command: str) -> dict:
    """Where and when a record was made, and the command that makes it again."""
    return {"cpu": cpu_model(), "cores": machine.usable_cores(), "torch": torch.__version__,
            "python": platform.python_version(), "kernel": platform.release(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_1min": round(os.getloadavg()[0], 1), "nice": _priority(), "command": command}


def save_record(name: str, value, meta: dict, path: str | Path = SPEED_PATH) -> None:
    """Store ``value`` (plain JSON data) as experiment ``name`` with ``meta``; others are kept."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = {"meta": meta, "value": value}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main(which: list[str]) -> None:
    command = "python benchmarks/record_speed_lessons.py"
    if "overlap" in which:
        m = measure_overlap()
        print(overlap_verdict(m))
        save_record("overlap", m, machine_meta(command + " overlap"))
    if "scaling" in which:
        rows = scaling_over_link()
        print(format_scaling_link(rows))
        print(scaling_verdict(rows))
        save_record("scaling_over_link", rows, machine_meta(command + " scaling"))
    if "bubble" in which:          # chapter 04's cell b7e1a9c2
        sweep = measure_bubble_sweep(p=2)
        print(sweep.table())
        save_record("bubble_sweep", sweep_record(sweep), machine_meta(command + " bubble"))
    if "order" in which:           # chapter 09's cells 7dff17d4 and 2ad1adc5
        reports = measure_torch_schedules(("1f1b", "interleaved-1f1b", "zb-v"), p=2, m=4,
                                          micro_batch=8, steps=3)
        print(order_verdict(reports))
        save_record("torch_schedule_order", order_record(reports), machine_meta(command + " order"))


if __name__ == "__main__":
    main(sys.argv[1:] or ["overlap", "scaling", "bubble", "order"])
