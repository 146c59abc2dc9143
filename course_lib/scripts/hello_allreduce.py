"""The course's first distributed program: every rank contributes ``rank + 1``; all_reduce sums.

One machine, 4 processes: ``torchrun --nproc-per-node=4 -m course_lib.scripts.hello_allreduce``;
alone (world size 1): ``python -m course_lib.scripts.hello_allreduce``. Two machines: the same
torchrun line with ``--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=HEAD:29500``, typed on both
(HEAD: the first machine's address). torchrun's stores have no authentication and listen on
every interface (the c10d rendezvous keeps a pickle there that every agent loads): run these on
your own machine, or on a cluster whose private network alone reaches the head node's port; on a
shared machine (a JupyterHub) use
``course_lib.torchrun("course_lib.scripts.hello_allreduce", 4, module=True)``, which runs them
in a private network namespace (docs/architecture.md, "Trust boundary").
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
