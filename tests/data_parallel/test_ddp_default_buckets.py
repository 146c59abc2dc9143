"""What chapter 02 says of torch's DDP buckets with the defaults, seen from a communication hook.

torch 2.13 (torch/nn/parallel/distributed.py, ``_BucketCapacityConfig``): without
``find_unused_parameters`` or ``static_graph`` the first iteration puts every gradient in one
bucket; the reducer then rebuilds the buckets in the order backward produced the gradients, capped
at 25 MiB, the first one at ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) when ``bucket_cap_mb`` is
left at its default.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_lib import run

WIDTH = 512  # one weight: 512 x 512 fp32 = 1 MiB


def _bucket_bytes_per_step(steps: int = 3) -> list[list[int]]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)]))  # the defaults
    seen: list[list[int]] = []

    def hook(state, bucket):
        buffer = bucket.buffer()
        seen[-1].append(buffer.numel() * buffer.element_size())
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)
    for _ in range(steps):
        seen.append([])
        model(torch.randn(8, WIDTH)).sum().backward()
    return seen


def test_the_first_step_sends_one_bucket_then_the_first_rebuilt_bucket_is_capped_at_1_mib():
    total = 4 * (WIDTH * WIDTH + WIDTH) * 4
    first, second, third = run(_bucket_bytes_per_step, 2)[0]
    assert first == [total]                               # one bucket for the whole model
    assert second == third and len(second) == 2 and sum(second) == total
    # last layer first: its bias and weight (1 MiB + 2 KiB) close the 1 MiB first bucket; the
    # other 3 layers (3.0 MiB) fit the 25 MiB cap of the second
    assert second[0] == (WIDTH * WIDTH + WIDTH) * 4 and dist._DEFAULT_FIRST_BUCKET_BYTES == 2 ** 20
