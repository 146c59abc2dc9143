"""How often do gloo ranks end badly? FSDP2 at 2 ranks and DDP at 4, launched N times (chapter 3).

    python benchmarks/bench_clean_exit.py            # 100 launches of each
    python benchmarks/bench_clean_exit.py --runs 20

Each launch runs one forward/backward through ``course_lib.run`` and records every rank's exit
status through ``run(..., report=RunReport())`` (0 = clean, -6 = SIGABRT). Before
the launcher ended ranks with ``os._exit``, 10-30 % of such runs aborted at interpreter shutdown
("terminate called without an active exception"). Prints the
counts and the median launch time.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

from course_lib import run
from course_lib.launcher.exit_codes import ddp_step, fsdp_step
from course_lib.launcher.launch import RunReport


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    run(ddp_step, 2)  # start the warm server outside the timings
    for name, fn, nprocs in (("FSDP2", fsdp_step, 2), ("DDP", ddp_step, 4)):
        seconds, failures, codes = [], 0, []
        for _ in range(args.runs):
            report = RunReport()
            start = time.perf_counter()
            try:
                run(fn, nprocs, report=report)
            except Exception:  # noqa: BLE001 - a failed launch is what we count
                failures += 1
            seconds.append(time.perf_counter() - start)
            codes.append(report.exit_statuses)  # filled even when run raised
        statuses = Counter(code for launch in codes for code in launch)
        bad = sum(1 for launch in codes if any(code != 0 for code in launch))
        print(f"{name} at {nprocs} ranks: {args.runs} launches, {bad} with a non-zero exit status, "
              f"{failures} raised; statuses {dict(statuses)}; median launch "
              f"{statistics.median(seconds) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
