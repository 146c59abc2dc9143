"""torch's pipeline schedules on 2 ranks: measured bubble next to each schedule's formula.

    PYTHONPATH=. python benchmarks/bench_torch_schedules.py [m ...]

For each micro-batch count m (default 4 and 8), runs ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B (2 stages per rank) and ScheduleZBVZeroBubble (2 stages per rank, a V)
with chapter 4's timing model (BUBBLE_CONFIG, 4 sequences per micro-batch, one thread per rank)
and prints the median measured bubble of 5 steps. Needs a core per rank to be meaningful: the
load average is printed first. A timing comparison, so it lives here, not in the unit tests.
"""
import os
import sys
import time

from course_lib.pipeline_parallel.torch_schedules import TORCH_SCHEDULES, measure_torch_schedule


def main(ms: list[int]) -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'schedule':>17} {'m':>3} {'bubble':>7} {'formula':>8} {'steps':>24} {'seconds':>8}")
    for m in ms:
        for schedule in TORCH_SCHEDULES:
            t0 = time.perf_counter()
            r = measure_torch_schedule(schedule, p=2, m=m)
            steps = " ".join(f"{b:.2f}" for b in r["bubbles"])
            print(f"{schedule:>17} {m:3d} {r['bubble']:7.3f} {r['formula']:8.3f} {steps:>24} "
                  f"{time.perf_counter() - t0:8.1f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4, 8])
