r"""The course's first distributed program: every rank contributes ``rank + 1``; all_reduce sums.

Run it on one machine with 4 processes:

    torchrun --nproc-per-node=4 -m course_lib.scripts.hello_allreduce

on two machines with 4 processes each (type on both; HEAD is the first machine's address):

    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=HEAD:29500 \
        -m course_lib.scripts.hello_allreduce

or alone, as a plain process (world size 1):  python -m course_lib.scripts.hello_allreduce

torchrun's stores have no authentication and listen on every interface (the c10d rendezvous
keeps a pickle there that every agent loads): type these commands on your own machine, or on a
cluster whose private network alone reaches the head node's port; on a shared machine (a
JupyterHub) use ``course_lib.torchrun("course_lib.scripts.hello_allreduce", 4, module=True)``,
which runs them in a private network namespace (docs/architecture.md, "Trust boundary").
"""
import torch
import torch.distributed as dist

from course_lib.launcher.torchrun import init_distributed


def main() -> float:
    rank, world = init_distributed()
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    print(f"rank {rank} of {world}: sum of (rank + 1) over all ranks = {value.item():g}")
    return value.item()


if __name__ == "__main__":
    main()
