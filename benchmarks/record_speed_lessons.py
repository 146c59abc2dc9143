"""Record the speed lessons' runs (chapters 02 and 05) into data/speed_lessons.json.

Where a notebook cannot run them (one usable core, no network namespaces), it shows these,
labelled with this machine, the date and the load. Run as root, or where unprivileged user
namespaces work, on a machine with 2 free cores, from the repository root:

    python benchmarks/record_speed_lessons.py            # both experiments
    python benchmarks/record_speed_lessons.py overlap    # one of: overlap, scaling
"""
from __future__ import annotations

import sys

from course_lib.common.recorded import machine_meta, save_record
from course_lib.communication.scaling_link import (format_scaling_link, scaling_over_link,
                                                    scaling_verdict)
from course_lib.data_parallel.overlap import measure_overlap, overlap_verdict


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


if __name__ == "__main__":
    main(sys.argv[1:] or ["overlap", "scaling"])
