"""Train a small MLP with DDP on a fixed global batch — one script for 1 process, 1 node, N nodes.

Chapter 05 runs it as two "nodes" (two torchrun agents) and checks that the parameters equal a
single process's on the same global batch. A ``DistributedSampler`` deals one shuffled epoch out
to the ranks, each taking every world-th sample of the global batch. Run
``python course_lib/communication/train_ddp.py --out one.pt`` or
``torchrun --standalone --nproc-per-node=2 course_lib/communication/train_ddp.py --out node.pt``;
``course_lib.communication.multinode.run_two_nodes()`` builds the two-node command lines.
``--standalone`` is for your own machine only: torchrun's stores have no authentication; on a
shared machine use ``course_lib.torchrun(...)`` or ``run_two_nodes()`` (a private network
namespace; docs/architecture.md, "Trust boundary").
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_lib.common.models import MLP
from course_lib.launcher.torchrun import init_distributed


def make_dataset(steps: int, global_batch: int, sizes: list[int], seed: int) -> TensorDataset:
    """Every sample of the run, ``steps × global_batch`` rows: one epoch (the same everywhere)."""
    gen = torch.Generator().manual_seed(seed + 1000)
    n = max(steps, 1) * global_batch
    return TensorDataset(torch.randn(n, sizes[0], generator=gen),
                         torch.randn(n, sizes[-1], generator=gen))


def epoch_order(n: int, seed: int, epoch: int = 0) -> torch.Tensor:
    """The shuffle ``DistributedSampler(shuffle=True, seed=seed)`` draws after ``set_epoch``:
    global batch ``s`` is positions ``s·B … (s+1)·B − 1`` of it, rank r taking every world-th."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


def train_reference(sizes: list[int], global_batch: int, steps: int, lr: float, seed: int
                    ) -> dict[str, torch.Tensor]:
    """What DDP must reproduce: plain SGD in one process on the whole global batch, no DDP."""
    torch.manual_seed(seed)
    model = MLP(sizes)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    data = make_dataset(steps, global_batch, sizes, seed)
    order = epoch_order(len(data), seed)
    for step in range(steps):
        x, y = data[order[step * global_batch:(step + 1) * global_batch]]
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="32,256,256,8", help="MLP layer widths, comma-separated")
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="rank 0 saves the final parameters here")
    args = parser.parse_args(argv)
    args.sizes = [int(n) for n in args.sizes.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = args.sizes

    rank, world = init_distributed()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} must divide over {world} ranks")
    share = args.global_batch // world
    torch.manual_seed(args.seed)
    model = DDP(MLP(sizes))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = make_dataset(args.steps, args.global_batch, sizes, args.seed)
    sampler = DistributedSampler(data, shuffle=True, seed=args.seed)  # rank r: every world-th
    loader = DataLoader(data, batch_size=share, sampler=sampler)
    sampler.set_epoch(0)  # one epoch here; a longer run calls it at each epoch's start
    times = []
    for step, (x, y) in zip(range(args.steps), loader):
        start = time.perf_counter()
        loss = F.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients over all ranks, on every node
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
        print(f"step {step} loss {loss.item():.4f} {times[-1] * 1e3:.1f} ms", flush=True)
    node = os.environ.get("GROUP_RANK", "0")
    mean = sum(times) / max(1, len(times))
    print(f"done: world {world}, node {node}, mean step {mean * 1e3:.1f} ms",
          flush=True)
    if rank == 0 and args.out:
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, args.out)
    dist.barrier()  # nobody leaves while a peer may still talk to it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter shutdown: gloo threads abort it now and then (SIGABRT)


if __name__ == "__main__":
    main()
