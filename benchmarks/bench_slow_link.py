"""Two "nodes" behind a shaped link: the same DDP and FSDP steps over fast and slow interconnects.

    python benchmarks/bench_slow_link.py                       # unthrottled, 1000, 100, 20 Mbit/s
    python benchmarks/bench_slow_link.py --rates 0 50 --steps 5 --strategies ddp
    python benchmarks/bench_slow_link.py --rates 1000 --latency-ms 1   # needs netem in the kernel

Runs :func:`course_lib.link_sweep` (chapter 5): each node in its own network namespace, joined
by a veth pair (10.99.0.1/2, addresses that exist only inside them), ``tc`` shaping both ends.
Needs root, or unprivileged user namespaces (``unshare --user --map-root-user --net``) and
iproute2; nothing leaves this machine. Without permission it says why and exits with status 2
(a skip, not a success). Prints, per link and strategy, the measured step next to the α-β
prediction (the unthrottled step + bytes / rate), and the bytes each node sent per step as the
veth's counter saw them next to the predicted bytes.
"""
from __future__ import annotations

import argparse
import os
import sys

from course_lib import LinkSweepUnavailable, link_sweep
from course_lib.communication.link_sweep import DEFAULT_SIZES
from course_lib.common.models import mlp_param_count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", type=float, default=[0, 1000, 100, 20],
                        help="link rates in Mbit/s; 0 = not throttled")
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"])
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    try:
        rows = link_sweep(args.rates, args.strategies, latency_ms=args.latency_ms,
                          steps=args.steps, sizes=sizes, device="cpu")
    except LinkSweepUnavailable as exc:
        print(f"skipped: {exc.reason}")
        sys.exit(2)
    print(f"2 nodes x 1 rank, {4 * mlp_param_count(sizes) / 1e6:.1f} MB of fp32 gradients per "
          f"step; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'link':>22}{'strategy':>9}{'step (ms)':>11}{'predicted':>11}{'ratio':>7}"
          f"{'sent (MB)':>11}{'predicted':>11}{'base (ms)':>11}{'compute':>9}")
    for r in rows:
        print(f"{r.link:>22}{r.strategy:>9}{r.step_s * 1e3:>11.1f}{r.predicted_s * 1e3:>11.1f}"
              f"{r.ratio:>7.2f}{r.sent_bytes / 1e6:>11.2f}{r.predicted_bytes / 1e6:>11.2f}"
              f"{r.base_s * 1e3:>11.1f}{r.compute_s * 1e3:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
