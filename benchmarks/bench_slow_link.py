"""Two "nodes" behind a throttled link: the same DDP step over fast and slow interconnects.

    sudo python benchmarks/bench_slow_link.py                     # unthrottled, 1000, 100, 20 Mbit/s
    sudo python benchmarks/bench_slow_link.py --rates 0 50 --steps 3

Needs root and iproute2 (``ip``, ``tc``): each node runs in its own network namespace, joined
by a veth pair with addresses 10.99.0.1/2 that exist only inside those namespaces; ``tc``'s
token-bucket filter throttles both ends. Nothing leaves this machine. Without permission it
says why and exits with status 2 (a skip, not a success). Prints the measured mean step time
next to the α-β prediction for the gradient all-reduce at the link rate (chapter 5).
"""
from __future__ import annotations

import argparse
import re
import sys

from course_lib.communication.alphabeta import ring_allreduce_time
from course_lib.common.models import mlp_param_count
from course_lib.communication.multinode import netns_available, run_two_nodes_netns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", type=float, default=[0, 1000, 100, 20],
                        help="link rates in Mbit/s; 0 = not throttled")
    parser.add_argument("--sizes", default="256,1024,1024,256")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    ok, why = netns_available()
    if not ok:
        print(f"skipped: {why}")
        sys.exit(2)
    grad_bytes = 4 * mlp_param_count([int(n) for n in args.sizes.split(",")])
    print(f"2 nodes x 1 rank, {grad_bytes / 1e6:.1f} MB of fp32 gradients per step")
    print(f"{'link':>14}{'mean step (ms)':>16}{'predicted all-reduce (ms)':>28}")
    for rate in args.rates:
        result = run_two_nodes_netns(rate or None, args=["--sizes", args.sizes,
                                                         "--steps", str(args.steps)])
        means = [float(m) for text in result.outputs
                 for m in re.findall(r"mean step ([\d.]+) ms", text)]
        predicted = ring_allreduce_time(grad_bytes, 2, 0.0, 8 / (rate * 1e6)) if rate else 0.0
        label = f"{rate:g} Mbit/s" if rate else "veth, no tc"
        print(f"{label:>14}{max(means):>16.1f}{predicted * 1e3:>28.1f}", flush=True)


if __name__ == "__main__":
    main()
