"""DDP's backward and its bucket all-reduces on every rank, as they ran (chapter 02's timeline).

Two (or more) ranks train torch's DDP on a stack of Linear layers with small buckets; after
warm-up steps (DDP rebuilds its buckets after the first), one step is recorded with
:class:`~course_lib.common.timeline.Timeline`: each layer's forward and backward in the compute
lane (module hooks), each bucket's all-reduce in the comm lane from its launch inside
``backward`` to gloo's completion. Buckets launched while later layers still compute are the
overlap chapter 02 describes; what is left after backward returns is the exposed tail.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_lib.common.checks import positive_int
from course_lib.common.timeline import Span, Timeline
from course_lib.launcher.launch import run

__all__ = ["ddp_timeline"]


def _ddp_timeline_rank(layers: int, width: int, batch: int, bucket_cap_mb: float,
                       warmup: int) -> list[Span]:
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(dist.get_rank()))
    x.requires_grad_(True)      # only so that the first layer's backward hook has a gradient to time
    tl = Timeline()
    handles = tl.watch((f"L{k}", layer) for k, layer in enumerate(net))
    for step in range(warmup + 1):
        tl.reset()
        dist.barrier()
        with tl:
            loss = model(x).square().mean()
            loss.backward()
            with tl.span("step"):
                opt.step()
                opt.zero_grad()
    for h in handles:
        h.remove()
    return tl.events()

def ddp_timeline(nprocs: int = 2, layers: int = 6, width: int = 384, batch: int = 64,
                 bucket_cap_mb: float = 1.0, warmup: int = 2, timeout: float = 60.0) -> list[Span]:
    """One recorded DDP step on ``nprocs`` ranks (one thread each): every rank's spans."""
    for value, name in ((nprocs, "nprocs"), (layers, "layers"), (width, "width"),
                        (batch, "batch"), (warmup, "warmup")):
        positive_int(value, name)
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
    per_rank = run(_ddp_timeline_rank, nprocs, layers, width, batch, bucket_cap_mb, warmup,
                   threads=1, timeout=timeout)
    return [s for spans in per_rank for s in spans]
