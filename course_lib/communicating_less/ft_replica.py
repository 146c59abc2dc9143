"""One torchft replica group's training loop (chapter 11; the notebook's editable cell is a copy).

torchft's ``Manager`` joins a quorum of the live replica groups before every step (through the
lighthouse), all-reduces gradients across it and fetches a live peer's state when this replica is
behind; torchft's ``DistributedDataParallel`` is torch's DDP whose communication hook is
``manager.allreduce``; ``OptimizerWrapper`` steps only when ``manager.should_commit()`` agrees.
:func:`course_lib.communicating_less.replicas.survive_a_failure` runs it (``train=``) in two
replica groups of one rank each, kills one and starts it again; ``log`` is its per-step line.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.nn.functional as F
from torch import nn
from torchft import Manager, ProcessGroupGloo
from torchft.ddp import DistributedDataParallel
from torchft.optim import OptimizerWrapper

from course_lib.communicating_less.task import task_batch

__all__ = ["train_replica"]


def train_replica(replica_id, lighthouse, store_port, steps, log):
    """Train the student as replica group ``replica_id`` until both groups are at ``steps``."""
    torch.manual_seed(replica_id)  # different weights per replica: only a fetch from a peer equals them
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 16))  # the chapter's student
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    wait = timedelta(seconds=30)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=wait),  # the replicas' all-reduce, rebuilt for each new quorum
        min_replica_size=1,                 # one live replica group may go on alone
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), opt.load_state_dict(sd["opt"])),
        state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
        replica_id=f"replica{replica_id}", lighthouse_addr=lighthouse,
        store_addr="127.0.0.1", store_port=store_port, rank=0, world_size=1,  # this group's ranks
        hostname="127.0.0.1", timeout=wait, quorum_timeout=wait, connect_timeout=wait)
    ddp = DistributedDataParallel(manager, model)  # gradients averaged over the quorum's groups
    optim = OptimizerWrapper(manager, opt)  # steps only if should_commit(): no error in this group
    while True:
        optim.zero_grad()  # starts this step's quorum; a group that is behind heals here
        x, y = task_batch(manager.current_step(), replica_id)
        F.mse_loss(ddp(x), y).backward()
        optim.step()
        log(manager.current_step(), manager.num_participants(), model)
        if manager.current_step() >= steps and manager.num_participants() == 2:
            return model
