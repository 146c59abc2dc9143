"""Record the speed lessons' runs (chapters 02, 04, 05, 09) into data/speed_lessons.json.

Where a notebook cannot run them (one usable core, no network namespaces), it shows these,
labelled with this machine, the date and the load. Run as root, or where unprivileged user
namespaces work, on a machine with 2 free cores, from the repository root:

    python benchmarks/record_speed_lessons.py            # every experiment
    python benchmarks/record_speed_lessons.py overlap    # one of: overlap, scaling, bubble, order
"""
from __future__ import annotations

import sys

from course_lib.common.recorded import machine_meta, save_record
from course_lib.communication.scaling_link import (format_scaling_link, scaling_over_link,
                                                    scaling_verdict)
from course_lib.data_parallel.overlap import measure_overlap, overlap_verdict
from course_lib.pipeline_parallel.bubble import measure_bubble_sweep, sweep_record
from course_lib.pipeline_parallel.torch_schedules import (measure_torch_schedules, order_record,
                                                          order_verdict)


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
