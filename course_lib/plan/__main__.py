"""``python -m course_lib.plan CONFIG --gpus 64 --gpus-per-node 8 ...``: the planner's table.

CONFIG is a stored name (``python -m course_lib.plan --list``), a ``config.json`` or a folder
holding one. A config the planner cannot build exits with status 2 and one line naming the field.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_lib.plan.clusters import CLUSTERS
from course_lib.plan.models import STORED, ConfigError
from course_lib.plan.planner import DEFAULTS, plan, plan_text
from course_lib.plan.stored import request_key, save_plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.plan", description=__doc__.split("\n")[0])
    parser.add_argument("config", nargs="?", help=f"a config.json, a folder, or one of: {', '.join(STORED)}")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=None)
    parser.add_argument("--cluster", choices=sorted(CLUSTERS), default="h100-80gb")
    parser.add_argument("--memory-gib", type=float, default=None, help="override the preset's memory per GPU")
    parser.add_argument("--global-batch", type=int, default=None, help="sequences per step (default: one per GPU)")
    parser.add_argument("--seq", type=int, default=8192, help="tokens per sequence")
    parser.add_argument("--efficiency", type=float, default=DEFAULTS["efficiency"],
                        help="achieved fraction of the peak FLOP/s")
    parser.add_argument("--top", type=int, default=15, help="rows to print (0: all)")
    parser.add_argument("--list", action="store_true", help="list the stored configs and clusters")
    parser.add_argument("--save", default=None, metavar="DIR",
                        help="also write the table to DIR as JSON (a new file named by the request)")
    args = parser.parse_args(argv)
    if args.list or not args.config:
        print("stored configs:", ", ".join(STORED))
        print("clusters:", ", ".join(f"{k} ({c.name})" for k, c in CLUSTERS.items()))
        return 0 if args.list else 2
    try:
        result = plan(args.config, gpus=args.gpus, gpus_per_node=args.gpus_per_node, cluster=args.cluster,
                      memory_gib=args.memory_gib, global_batch=args.global_batch, seq_len=args.seq,
                      efficiency=args.efficiency,
                      progress=lambda i, n, label: print(f"\r[{i + 1}/{n}] {label:40}", end="",
                                                         file=sys.stderr, flush=True))
    except (ConfigError, ValueError) as err:
        print(f"\nerror: {err}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    print(plan_text(result, top=args.top or None))
    if args.save:
        request = dict(gpus=args.gpus, gpus_per_node=args.gpus_per_node or 8, cluster=args.cluster,
                       memory_gib=args.memory_gib, global_batch=args.global_batch, seq_len=args.seq)
        path = Path(args.save) / f"{request_key(args.config, **request)}.json"
        print(f"saved {save_plan(result, path, {'model': args.config, **request})}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
