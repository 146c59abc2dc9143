"""Pipeline parallelism: each rank runs some of the blocks; micro-batches flow from rank to rank.

    torchrun --standalone --nproc-per-node=2 course_lib/scripts/pipeline.py   # 2 stages
    python course_lib/scripts/pipeline.py                                     # one stage
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import tiny  # the model and data, the file beside this one

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank, world = dist.get_rank(), dist.get_world_size()

part = tiny.Stage(tiny.model(), rank, world).to(device)  # this rank's blocks (+ embeddings / head)
stage = PipelineStage(part, rank, world, device)
schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=tiny.GPT.loss)  # grads: mean over 4
opt = torch.optim.Adam(part.parameters(), lr=tiny.LR)

for step in range(tiny.STEPS):
    x, y = tiny.batch(step)
    losses = []
    inputs = (x.to(device),) if part.first else ()  # the first stage takes the tokens,
    targets = {"target": y.to(device), "losses": losses} if part.last else {}  # the last, targets
    schedule.step(*inputs, **targets)
    opt.step()
    opt.zero_grad()
    if part.last:  # the loss exists on the last stage only
        tiny.log(step, torch.stack(losses).mean().item())

dist.destroy_process_group()
# On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
# called without an active exception"), which torchrun reports as a failed rank: end here instead.
sys.stdout.flush()
os._exit(0)
