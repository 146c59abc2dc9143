"""Checkpoint and resume with torch.distributed.checkpoint (DCP): each rank saves its own shard.

    torchrun --standalone --nproc-per-node=2 course_lib/scripts/checkpoint.py [DIR]   # 2 ranks
    python course_lib/scripts/checkpoint.py [DIR]                                     # one process

Trains FSDP2 for half the steps, saves into DIR (default ``outputs/checkpoint`` in the current
folder, which the course's git ignores; an earlier run's checkpoint there is overwritten), then
loads it into a freshly built model and optimizer, as a restarted job would, and trains on: the
losses go on exactly as an uninterrupted run's (compare with ``fsdp.py`` without its bf16 policy).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import tiny  # the model and data, the file beside this one

device = tiny.device()  # cuda:LOCAL_RANK with a GPU, else the CPU
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **tiny.alone())
rank, world = dist.get_rank(), dist.get_world_size()
folder = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "outputs/checkpoint")


def build(seed):
    model = tiny.model(seed).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=tiny.LR)


model, opt = build(seed=0)
for step in range(tiny.STEPS):
    if step == tiny.STEPS // 2:  # save; then resume into new weights, as after a crash
        model_state, optim_state = get_state_dict(model, opt)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
        model, opt = build(seed=1)  # other weights, empty optimizer: the load must fix both
        model_state, optim_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=folder)  # in place: here, into the model's own shards
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    x, y = tiny.batch(step)
    shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)  # this rank's rows
    loss = model.loss(model(x[shard].to(device)), y[shard].to(device))
    loss.backward()
    opt.step()
    opt.zero_grad()
    dist.all_reduce(mean := loss.detach() / world)
    if rank == 0:
        tiny.log(step, mean.item())

dist.destroy_process_group()
# On the CPU, gloo's threads can abort Python's own shutdown after every line ran ("terminate
# called without an active exception"), which torchrun reports as a failed rank: end here instead.
sys.stdout.flush()
os._exit(0)
