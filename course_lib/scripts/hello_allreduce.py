"""The course's first distributed program: every rank contributes ``rank + 1``; all_reduce sums.

    torchrun --nproc-per-node=4 course_lib/scripts/hello_allreduce.py   # 4 processes
    python course_lib/scripts/hello_allreduce.py                        # alone (world size 1)

Two machines: the same torchrun line with ``--nnodes=2 --rdzv-backend=c10d
--rdzv-endpoint=HEAD:29500``, typed on both (HEAD: the first machine's address). torchrun's
stores have no authentication and listen on every interface: run these on your own machine, or
on a cluster whose private network alone reaches the head node's port; on a shared machine (a
JupyterHub) use ``course_lib.torchrun("course_lib/scripts/hello_allreduce.py", 4)``, which runs
them in a private network namespace (docs/architecture.md, "Trust boundary").
"""
import os
import sys

import torch
import torch.distributed as dist


def main() -> float:
    if "RANK" in os.environ:  # under torchrun: it set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        dist.init_process_group("gloo")
    else:  # alone: a group of one, its store in memory (no port opened)
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)  # every rank now holds 1 + 2 + ... + world
    print(f"rank {rank} of {world}: sum of (rank + 1) over all ranks = {value.item():g}",
          flush=True)
    dist.destroy_process_group()
    return value.item()


if __name__ == "__main__":
    main()
    # On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
    # called without an active exception"), which torchrun reports as a failed rank: end here.
    sys.stdout.flush()
    os._exit(0)
