"""A first distributed program: every rank contributes ``rank + 1``; all_reduce sums.

    torchrun --nproc-per-node=4 hello_allreduce.py     # 4 processes on this machine

On two machines, the same line with ``--nnodes=2 --rdzv-backend=c10d
--rdzv-endpoint=HEAD:29500``, typed on both (HEAD: the first machine's address). torchrun's
stores have no authentication: on a shared machine (a JupyterHub) use ``course_lib.torchrun``,
which runs the job in a private network namespace.
"""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()

value = torch.tensor([rank + 1.0])
dist.all_reduce(value, op=dist.ReduceOp.SUM)  # every rank now holds the sum
print(f"rank {rank} of {world}: sum of (rank + 1) over all ranks = {value.item():g}")

dist.destroy_process_group()
# On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
# called without an active exception"), which torchrun reports as a failed rank: end here instead.
sys.stdout.flush()
os._exit(0)
