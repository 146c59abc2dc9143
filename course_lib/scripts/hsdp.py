"""HSDP: FSDP2 shards inside a group of ranks (a node) and replicates across groups, on a 2-D mesh.

    torchrun --standalone --nproc-per-node=4 course_lib/scripts/hsdp.py   # replicate 2 × shard 2
    python course_lib/scripts/hsdp.py                                     # one process
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from course_lib.scripts import tiny

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank, world = dist.get_rank(), dist.get_world_size()
shard = 2 if world % 2 == 0 else 1  # on a cluster: the GPUs of one node
mesh = init_device_mesh(device.type, (world // shard, shard),
                        mesh_dim_names=("dp_replicate", "dp_shard"))

model = tiny.model().to(device)
for block in model.blocks:
    fully_shard(block, mesh=mesh)  # a 2-D mesh: shard along dim 1, replicate along dim 0
fully_shard(model, mesh=mesh)
opt = torch.optim.Adam(model.parameters(), lr=tiny.LR)  # 1/shard of the state per rank
data = tiny.dataset()
sampler = DistributedSampler(data, shuffle=True, seed=0)  # every rank its own data
loader = DataLoader(data, batch_size=tiny.GLOBAL_BATCH // world, sampler=sampler)

step = 0
for epoch in range(tiny.STEPS * tiny.GLOBAL_BATCH // len(data)):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = model.loss(model(x.to(device)), y.to(device))
        loss.backward()  # reduce-scatter in dp_shard, then all-reduce across dp_replicate
        opt.step()
        opt.zero_grad()
        dist.all_reduce(mean := loss.detach() / world)
        if rank == 0:
            tiny.log(step, mean.item())
        step += 1

dist.destroy_process_group()
