"""FSDP2: each rank keeps 1/N of every weight, gradient and optimizer state; compute in bf16.

    torchrun --standalone --nproc-per-node=2 course_lib/scripts/fsdp.py   # 2 ranks (CPU or GPUs)
    python course_lib/scripts/fsdp.py                                     # one process
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, DistributedSampler

import tiny  # the model and data, the file beside this one

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank, world = dist.get_rank(), dist.get_world_size()

model = tiny.model().to(device)
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for block in model.blocks:
    fully_shard(block, mp_policy=mp)  # one all-gather / reduce-scatter unit per block
fully_shard(model, mp_policy=mp)      # the root: embeddings, final norm, head
opt = torch.optim.Adam(model.parameters(), lr=tiny.LR)  # built after sharding: 1/N of the state
data = tiny.dataset()
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=tiny.GLOBAL_BATCH // world, sampler=sampler)

step = 0
for epoch in range(tiny.STEPS * tiny.GLOBAL_BATCH // len(data)):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = model.loss(model(x.to(device)), y.to(device))
        loss.backward()  # reduce-scatter: each rank gets the averaged gradient of its shard
        opt.step()
        opt.zero_grad()
        dist.all_reduce(mean := loss.detach() / world)
        if rank == 0:
            tiny.log(step, mean.item())
        step += 1

dist.destroy_process_group()
# On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
# called without an active exception"), which torchrun reports as a failed rank: end here instead.
sys.stdout.flush()
os._exit(0)
