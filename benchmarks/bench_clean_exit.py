"""How often do gloo ranks end badly? FSDP2 at 2 ranks and DDP at 4, launched N times (chapter 3).

    python benchmarks/bench_clean_exit.py            # 100 launches of each
    python benchmarks/bench_clean_exit.py --runs 20

Each launch runs one forward/backward through ``course_lib.run`` and records every rank's exit
status through ``run(..., report=RunReport())`` (0 = clean, -6 = SIGABRT). Before
the launcher ended ranks with ``os._exit``, 10-30 % of such runs aborted at interpreter shutdown
("terminate called without an active exception"). Prints the
counts and the median launch time. ``tests/sharding/test_distributed_memory.py`` launches the
same two steps (from here) 10 times each.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
from torch.distributed.fsdp import fully_shard

from course_lib import run
from course_lib.launcher.launch import RunReport


def fsdp_step() -> int:
    """One FSDP2 forward/backward on a toy model (the launch pattern that aborted at exit)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model(torch.randn(2, 8)).sum().backward()
    return 0


def ddp_step() -> int:
    """One DDP forward/backward on a toy model (the other launch pattern that aborted)."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    model(torch.randn(2, 8)).sum().backward()
    return 0


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
