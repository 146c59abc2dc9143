"""A DDP step under ``torch.profiler``, read back from its Chrome trace: chapter 05's overlap, seen twice.

:func:`profiled_ddp_step` (chapter 05's cell is its editable copy) runs inside each rank: DDP on
chapter 02's stack of ``Linear`` layers, warm-up steps, then one step under
``torch.profiler.profile``, exported as a Chrome trace. :func:`trace_spans` reads a trace back into
the course's :class:`~course_lib.common.timeline.Span` records: compute from the training thread
(autograd's backward nodes, ``aten::linear``, the optimizer step), communication from the
``gloo:*`` events of gloo's worker threads. :func:`overlap` splits a rank's communication into
what ran inside its backward window and what ran after; it reads the course's ``Timeline`` spans
too. What each event means: docs/modules/communication.md (communication/profiling.py).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

from course_lib.common.timeline import Span

__all__ = ["profiled_ddp_step", "trace_spans", "overlap"]

_BACKWARD_NODE = re.compile(r"^[A-Za-z0-9_]+Backward\d*$")


def profiled_ddp_step(layers=6, width=384, batch=64, bucket_cap_mb=1.0, warmup=2, trace_dir="traces"):
    """Inside a rank: DDP steps, the last one under torch.profiler; returns this rank's trace file."""
    import os
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile

    os.environ["KINETO_LOG_LEVEL"] = "6"       # keep the profiler's start/stop log lines quiet
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    model = DDP(net, bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(rank))

    def step():
        model(x).square().mean().backward()    # DDP all-reduces each bucket as backward fills it
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(warmup):                    # DDP rebuilds its buckets after the first step
        step()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    path = Path(trace_dir) / f"ddp_step_rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return str(path)


def _compute_name(name: str) -> str | None:
    if _BACKWARD_NODE.match(name):
        return f"backward {name}"
    if name == "aten::linear":
        return "forward linear"
    if name.startswith("Optimizer.step#"):
        return "step"
    return None


def trace_spans(path: str | Path, rank: int) -> list[Span]:
    """The compute and communication spans of one rank's Chrome trace (seconds, the profiler's clock)."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"]
              if e.get("ph") == "X" and "ts" in e and "dur" in e]
    if not events:
        raise ValueError(f"{Path(path).name}: no complete events; was the step run inside profile()?")
    main = Counter(e["tid"] for e in events if _compute_name(e["name"])).most_common(1)
    main_tid = main[0][0] if main else None
    spans = []
    for e in events:
        t0 = float(e["ts"]) * 1e-6
        t1 = t0 + float(e["dur"]) * 1e-6
        if e["name"].startswith("gloo:"):
            spans.append(Span(rank, "comm", e["name"].removeprefix("gloo:"), t0, t1))
        elif e["tid"] == main_tid and (name := _compute_name(e["name"])):
            spans.append(Span(rank, "compute", name, t0, t1))
    return sorted(spans, key=lambda s: s.t0)


def overlap(spans: list[Span]) -> dict[int, dict[str, float]]:
    """Per rank, in seconds: ``comm`` (the communication spans' total), ``hidden`` (the part inside
    the backward window: from the first backward span's start to the last one's end) and
    ``exposed`` (the rest)."""
    out = {}
    for rank in sorted({s.rank for s in spans}):
        mine = [s for s in spans if s.rank == rank]
        backward = [s for s in mine if s.lane == "compute" and s.name.startswith("backward")]
        comm = [s for s in mine if s.lane == "comm"]
        if not backward or not comm:
            raise ValueError(f"rank {rank}: need backward and communication spans, "
                             f"got {len(backward)} and {len(comm)}")
        start, end = min(s.t0 for s in backward), max(s.t1 for s in backward)
        total = sum(s.t1 - s.t0 for s in comm)
        hidden = sum(max(0.0, min(s.t1, end) - max(s.t0, start)) for s in comm)
        out[rank] = {"comm": total, "hidden": hidden, "exposed": total - hidden}
    return out
