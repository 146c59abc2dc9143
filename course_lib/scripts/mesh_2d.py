"""Two layouts on a 2-D mesh of 4 ranks: FSDP2 × tensor parallelism, then HSDP (replicate × shard).

    torchrun --standalone --nproc-per-node=4 course_lib/scripts/mesh_2d.py   # 2 × 2 meshes
    python course_lib/scripts/mesh_2d.py                                     # one process
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler

import tiny  # the model and data, the file beside this one

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank, world = dist.get_rank(), dist.get_world_size()
inner = 2 if world % 2 == 0 else 1  # the inner dimension: adjacent ranks (on a cluster, one node)


def train(model, dp_rank, dp_size, step):
    """tiny.STEPS Adam steps; the data split over the dp_size data-parallel ranks."""
    opt = torch.optim.Adam(model.parameters(), lr=tiny.LR)  # built after sharding
    data = tiny.dataset()
    sampler = DistributedSampler(data, num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=tiny.GLOBAL_BATCH // dp_size, sampler=sampler)
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
    return step


# 1. FSDP2 × TP: tensor parallelism inside each pair of adjacent ranks, FSDP2 across the pairs
mesh = init_device_mesh(device.type, (world // inner, inner), mesh_dim_names=("dp", "tp"))
model = tiny.group_heads(tiny.model(), inner).to(device)  # qkv rows: rank r's heads together
for block in model.blocks:
    parallelize_module(block, mesh["tp"], {"attn.qkv": ColwiseParallel(),
                                           "attn.proj": RowwiseParallel(),
                                           "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()})
    fully_shard(block, mesh=mesh["dp"])  # each TP shard cut again, by rows
fully_shard(model, mesh=mesh["dp"])
step = train(model, mesh["dp"].get_local_rank(), mesh["dp"].size(), step=0)  # a pair: one batch

# 2. HSDP: FSDP2 shards inside each pair and replicates across the pairs; every rank its own data
mesh = init_device_mesh(device.type, (world // inner, inner),
                        mesh_dim_names=("dp_replicate", "dp_shard"))
model = tiny.model().to(device)
for block in model.blocks:
    fully_shard(block, mesh=mesh)  # a 2-D mesh: shard along dp_shard, replicate along dp_replicate
fully_shard(model, mesh=mesh)
train(model, rank, world, step=step)

dist.destroy_process_group()
# On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
# called without an active exception"), which torchrun reports as a failed rank: end here instead.
sys.stdout.flush()
os._exit(0)
