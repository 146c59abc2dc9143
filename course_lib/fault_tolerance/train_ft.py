"""Fault-tolerant training: FSDP2 GPT, sharded checkpoints, resume after any restart.

Chapter 6. Every (re)start resumes from the latest *complete* checkpoint in ``--ckpt-dir``; keep
it in a folder of your own (``D=$(mktemp -d)``: a fixed name under ``/tmp`` can be created first
by another user, and the save then refuses it). One machine, 2 processes, up to 3 restarts:
``torchrun --standalone --nproc-per-node=2 --max-restarts=3 -m course_lib.fault_tolerance.train_ft
--ckpt-dir $D/ckpt --steps 12 --every 3 --out $D/final.pt``; alone: ``python -m
course_lib.fault_tolerance.train_ft --steps 4``. Fail on purpose with ``COURSE_FT_FAULTS=0:1:5:kill``
(attempt:rank:step:kind; kinds kill, raise, save). Rank 0 writes ``{"losses", "params"}`` to
``--out`` (``torch.load(path, weights_only=True)``). ``--standalone`` is for your own machine
only: torchrun's stores have no authentication; on a shared machine use ``course_lib.torchrun``.
Multi-node commands (a shared file system): docs/modules/scripts.md (train_ft.py).
"""
from __future__ import annotations

import argparse
import os

import torch

from course_lib.fault_tolerance.training import FAULTS_ENV, parse_faults, train
from course_lib.launcher.torchrun import init_distributed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="course GPT preset (tiny, small, ...)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3, help="checkpoint every N steps (0: never)")
    parser.add_argument("--ckpt-dir", default="", help="where checkpoints live (shared by ranks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=2, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--keep", type=int, default=2, help="committed checkpoints to keep")
    parser.add_argument("--faults", default=os.environ.get(FAULTS_ENV, ""),
                        help=f"attempt:rank:step:kind,... (default: ${FAULTS_ENV})")
    parser.add_argument("--out", default="", help="rank 0 saves losses and final parameters here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    faults = parse_faults(args.faults)  # a typo fails here, before any process group exists
    rank, world = init_distributed()
    result = train(args.preset, args.steps, ckpt_dir=args.ckpt_dir or None, every=args.every,
                   seed=args.seed, batch_size=args.batch_size, lr=args.lr, faults=faults,
                   keep=args.keep)
    start = result["resumed_from"]
    if rank == 0:
        print(f"attempt {result['attempt']}: world {world}, "
              f"{'resumed from step ' + str(start) if start is not None else 'started fresh'}, "
              f"final loss {result['losses'][-1]:.4f}", flush=True)
        if args.out:
            torch.save({"losses": torch.tensor(result["losses"], dtype=torch.float64),
                        "params": result["params"]}, args.out)
    return result


if __name__ == "__main__":
    main()
