"""Tensor parallelism (Megatron's split) with DTensor: every linear of a block is cut across ranks.

    torchrun --standalone --nproc-per-node=2 course_lib/scripts/tensor_parallel.py   # 2 ranks
    python course_lib/scripts/tensor_parallel.py                                     # one process
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import tiny  # the model and data, the file beside this one

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))

model = tiny.group_heads(tiny.model(), world).to(device)  # qkv rows: rank r's heads together
for block in model.blocks:  # column-parallel in, row-parallel out: one all-reduce per pair
    parallelize_module(block, mesh, {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                                     "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()})
opt = torch.optim.Adam(model.parameters(), lr=tiny.LR)

for step in range(tiny.STEPS):
    x, y = tiny.batch(step)  # every rank reads the same batch: TP splits the model, not the data
    loss = model.loss(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    opt.zero_grad()
    if rank == 0:
        tiny.log(step, loss.item())

dist.destroy_process_group()
# On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
# called without an active exception"), which torchrun reports as a failed rank: end here instead.
sys.stdout.flush()
os._exit(0)
