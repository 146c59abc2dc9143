"""Data parallelism with torch's DDP: every rank holds the whole model and reads its own data.

    torchrun --standalone --nproc-per-node=2 course_lib/scripts/ddp.py   # 2 ranks (CPU or GPUs)
    python course_lib/scripts/ddp.py                                     # one process
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import tiny  # the model and data, the file beside this one

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank, world = dist.get_rank(), dist.get_world_size()

model = DDP(tiny.model().to(device))  # same weights everywhere; DDP averages the gradients
opt = torch.optim.Adam(model.parameters(), lr=tiny.LR)
data = tiny.dataset()
sampler = DistributedSampler(data, shuffle=True, seed=0)  # rank r reads every world-th window
loader = DataLoader(data, batch_size=tiny.GLOBAL_BATCH // world, sampler=sampler)

step = 0
for epoch in range(tiny.STEPS * tiny.GLOBAL_BATCH // len(data)):
    sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    for x, y in loader:
        loss = model.module.loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(mean := loss.detach() / world)  # the loss over the whole global batch
        if rank == 0:
            tiny.log(step, mean.item())
        step += 1

dist.destroy_process_group()
# On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
# called without an active exception"), which torchrun reports as a failed rank: end here instead.
sys.stdout.flush()
os._exit(0)
