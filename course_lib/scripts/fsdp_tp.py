"""FSDP2 × tensor parallelism on a 2-D mesh: TP inside a pair of adjacent ranks, FSDP across pairs.

    torchrun --standalone --nproc-per-node=4 course_lib/scripts/fsdp_tp.py   # dp 2 × tp 2
    python course_lib/scripts/fsdp_tp.py                                     # one process
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler

from course_lib.scripts import tiny

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank, world = dist.get_rank(), dist.get_world_size()
tp = 2 if world % 2 == 0 else 1  # the inner dimension: adjacent ranks (on a cluster, one node)
mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))

model = tiny.group_heads(tiny.model(), tp).to(device)  # qkv rows: rank r's heads together
for block in model.blocks:  # 1. tensor parallelism along "tp": chapter 4's plan
    parallelize_module(block, mesh["tp"], {"attn.qkv": ColwiseParallel(),
                                           "attn.proj": RowwiseParallel(),
                                           "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()})
    fully_shard(block, mesh=mesh["dp"])  # 2. then FSDP2 along "dp": each TP shard cut again
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.Adam(model.parameters(), lr=tiny.LR)

data = tiny.dataset()  # the two ranks of a TP pair must read the same batch: sample along "dp"
sampler = DistributedSampler(data, num_replicas=mesh["dp"].size(), rank=mesh["dp"].get_local_rank(),
                             shuffle=True, seed=0)
loader = DataLoader(data, batch_size=tiny.GLOBAL_BATCH // mesh["dp"].size(), sampler=sampler)

step = 0
for epoch in range(tiny.STEPS * tiny.GLOBAL_BATCH // len(data)):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = model.loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(mean := loss.detach() / world)  # a TP pair holds the same loss twice
        if rank == 0:
            tiny.log(step, mean.item())
        step += 1

dist.destroy_process_group()
