"""Data-parallel training of the course GPT — by hand or with torch DDP — as a script (chapter 2).

The notebook's code (:func:`course_lib.data_parallel.measure.train_rank_dp`): every rank trains
on its share of each global batch; ``--mode hand`` broadcasts the weights and all-reduces the
gradients itself, ``--mode torch`` wraps the model in ``DistributedDataParallel``. Rank 0 then
trains one process on the concatenated batch and prints the largest weight difference. Run
``torchrun --nproc-per-node=4 -m course_lib.data_parallel.train_dp --mode hand``, or alone
``python -m course_lib.data_parallel.train_dp``; on two machines add ``--nnodes=2 --rdzv-backend=c10d
--rdzv-endpoint=HEAD:29500`` on both. torchrun's stores have no authentication and listen on
every interface: your own machine, or a cluster whose private network alone reaches the head
node's port; on a shared machine use ``course_lib.torchrun(...)`` (a private network namespace).
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from course_lib.data_parallel.measure import TOLERANCE, max_diff, train_rank_dp, train_single
from course_lib.launcher.torchrun import init_distributed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("hand", "torch"), default="hand")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--local-batch", type=int, default=4, help="rows per rank and step")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="tiny")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    """Train; rank 0 prints the losses and the difference to one process. Returns it."""
    args = parse_args(argv)
    torch.set_num_threads(1)   # one core per rank: the CPU analogue of one GPU per rank
    rank, world = init_distributed()
    params, losses = train_rank_dp(args.mode, args.steps, args.local_batch, args.seq_len, args.lr,
                                args.seed, args.preset)
    mean_losses = torch.tensor(losses)
    dist.all_reduce(mean_losses)                 # the global loss: mean of the ranks' losses
    mean_losses /= world
    diff = 0.0
    if rank == 0:
        single, _ = train_single(args.steps, args.local_batch * world, args.seq_len, lr=args.lr,
                                 seed=args.seed, preset=args.preset)
        diff = max_diff(params, single)
        verdict = "equal" if diff <= TOLERANCE["atol"] else "DIFFERENT"
        print(f"{args.mode} DP on {world} rank(s), global batch {args.local_batch * world}: "
              f"losses {[round(x, 4) for x in mean_losses.tolist()]}")
        print(f"max |weights - one process| = {diff:.1e} -> {verdict}", flush=True)
    dist.barrier()   # nobody leaves while a peer may still talk to it
    return diff


if __name__ == "__main__":
    main()
