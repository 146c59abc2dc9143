"""Collective sweep like nccl-tests: time, algbw, busbw from 1 KiB up to 256 MiB (chapter 5).

    python benchmarks/bench_collectives.py                       # 1 KiB-64 MiB, 2 and 4 ranks
    python benchmarks/bench_collectives.py --worlds 2 4 8 --largest 268435456   # full sweep
    python benchmarks/bench_collectives.py --collectives all_reduce --ring   # + hand ring

Runs gloo on CPU (NCCL with one GPU per rank where there are enough GPUs). Prints one table per
world size, the one-process memory-copy ceiling, and the α-β fit of the all-reduce points.
"""
from __future__ import annotations

import argparse
import time

from course_lib.communication.alphabeta import fit_errors, fit_per_world, points_of
from course_lib.communication.benchmark import (COLLECTIVES, benchmark_collectives, format_table,
                                                memcopy_bandwidth, power_sizes, size_label)
from course_lib.communication.ring import compare_ring


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", nargs="+", default=list(COLLECTIVES))
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--smallest", type=int, default=2**10)
    parser.add_argument("--largest", type=int, default=2**26)
    parser.add_argument("--factor", type=int, default=4, help="size step (nccl-tests -f)")
    parser.add_argument("--iters", type=int, default=None, help="default: fewer for big sizes")
    parser.add_argument("--ring", action="store_true", help="also time the hand-written ring")
    args = parser.parse_args()
    sizes = power_sizes(args.smallest, args.largest, args.factor)
    start = time.monotonic()
    ceiling = memcopy_bandwidth(min(args.largest, 2**28))
    rows = []
    for world in args.worlds:
        part = benchmark_collectives(args.collectives, sizes, world, iters=args.iters)
        rows += part
        print(format_table(part), "\n", flush=True)
    print(f"ceiling: one process copies {size_label(min(args.largest, 2**28))} "
          f"at {ceiling:.1f} GB/s")
    for world, fit in fit_per_world(rows).items():
        errs = fit_errors(fit, [p for p in points_of(rows) if p[0] == world])
        print(f"all_reduce α-β fit, {world} ranks: {fit}; worst point "
              f"{max(abs(e) for e in errs):.0%} off")
    if args.ring:
        for world in args.worlds:
            for r in compare_ring(sizes, world):
                print(f"ring vs dist.all_reduce, {world} ranks, {size_label(r['bytes']):>9}: "
                      f"{r['ring_s'] * 1e3:8.3f} ms vs {r['torch_s'] * 1e3:8.3f} ms")
    print(f"total {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
