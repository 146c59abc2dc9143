"""Launch overhead: course_lib.run (warm fork server) vs torchrun, for trivial work.

    python benchmarks/bench_launch.py [--ranks 4] [--repeats 30] [--torchrun-repeats 3]

Each launch starts N ranks, joins the process group, does one all_reduce and exits. Prints the
median, p90 and max for both paths and the ratio (the foundation issue asks for a median
<= 0.1 s at 4 ranks and >= 20x faster than torchrun on a 2-core machine).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from course_lib.launch import run, warm_up
from course_lib.torchrun import torchrun

SCRIPT = """
import torch, torch.distributed as dist
from course_lib.torchrun import init_distributed
init_distributed()
t = torch.ones(1)
dist.all_reduce(t)
"""


def trivial() -> float:
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def stats(times: list[float]) -> str:
    times = sorted(times)
    p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
    return f"median {statistics.median(times):.3f} s  p90 {p90:.3f} s  max {times[-1]:.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--torchrun-repeats", type=int, default=3)
    opts = parser.parse_args()

    t0 = time.perf_counter()
    warm_up()
    print(f"warm server start (once per kernel): {time.perf_counter() - t0:.2f} s")
    fast = []
    for _ in range(opts.repeats):
        t0 = time.perf_counter()
        assert run(trivial, opts.ranks) == [float(opts.ranks)] * opts.ranks
        fast.append(time.perf_counter() - t0)
    print(f"course_lib.run, {opts.ranks} ranks x {opts.repeats}: {stats(fast)}")

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(SCRIPT)
    slow = []
    try:
        for _ in range(opts.torchrun_repeats):
            t0 = time.perf_counter()
            torchrun(f.name, opts.ranks, quiet=True)
            slow.append(time.perf_counter() - t0)
    finally:
        os.unlink(f.name)
    print(f"torchrun,       {opts.ranks} ranks x {opts.torchrun_repeats}: {stats(slow)}")
    ratio = statistics.median(slow) / statistics.median(fast)
    print(f"course_lib.run is {ratio:.0f}x faster than torchrun (median vs median)")
    sys.exit(0)


if __name__ == "__main__":
    main()
