"""A pipeline stage measured from outside its schedule (chapter 4): when each step ran, what it stashed.

:class:`TracedSteps` is :class:`~course_lib.pipeline_parallel.schedules.StageSteps` with every
receive, forward and backward timed into a :class:`StageTrace` (``time.perf_counter``, and the
CPU time of each operation with ``time.thread_time``; each forward and backward first yields the
core, so the gloo thread carrying the previous op's ``isend`` runs before the compute and not a
scheduler slice later: docs/decisions/pipeline-bubble.md, "Why a pipeline rank yields its core
before each timed action"), and the bytes autograd saves during each
forward added up (``saved_tensors_hooks``): the activations a micro-batch keeps until its
backward. :func:`~course_lib.pipeline_parallel.schedules.run_schedule` stays the plain loop;
:mod:`~course_lib.pipeline_parallel.measure` turns the traces into bubble, transfer and stash.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from course_lib.pipeline_parallel.schedules import StageSteps

__all__ = ["StageTrace", "TracedSteps"]


@dataclass
class StageTrace:
    """What one stage did: ``events`` = (kind, micro-batch, start, end) in perf_counter seconds."""

    rank: int
    events: list = field(default_factory=list)
    waits: list = field(default_factory=list)   # (kind, micro-batch, start, end) blocked in recv
    cpu: list = field(default_factory=list)     # CPU seconds of each event (thread_time)
    stash_peak_count: int = 0        # micro-batches whose activations were held at once, at most
    stash_peak_bytes: int = 0        # bytes of saved activations at that moment (measured)
    loss: float | None = None        # mean loss over micro-batches (last stage only)
    grads: dict = field(default_factory=dict)


def _saved_bytes(stage: nn.Module, store: dict) -> torch.autograd.graph.saved_tensors_hooks:
    """Hooks that add up the bytes autograd saves for backward (each storage once, no params)."""
    params = {p.untyped_storage().data_ptr() for p in stage.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in store:
            store[ptr] = t.untyped_storage().nbytes()
        return t
    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


class TracedSteps(StageSteps):
    """:class:`StageSteps` that records each call into ``trace`` (the schedule does not know)."""

    def __init__(self, stage: nn.Module, micro_targets: list, trace: StageTrace) -> None:
        super().__init__(stage, micro_targets)
        self.trace, self.stash = trace, {}   # micro-batch -> bytes saved for its backward

    def recv(self, kind: str, i: int, shape: tuple[int, ...], src: int) -> torch.Tensor:
        start = time.perf_counter()
        x = super().recv(kind, i, shape, src)
        self.trace.waits.append((kind, i, start, time.perf_counter()))
        return x

    def forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        saved: dict = {}
        with _saved_bytes(self.stage, saved):
            y = self._timed("F", i, super().forward, i, x)
        self.stash[i] = sum(saved.values())
        trace = self.trace
        trace.stash_peak_count = max(trace.stash_peak_count, len(self.stash))
        trace.stash_peak_bytes = max(trace.stash_peak_bytes, sum(self.stash.values()))
        return y

    def backward(self, i: int, y: torch.Tensor, grad: torch.Tensor | None) -> None:
        self.stash.pop(i)
        self._timed("B", i, super().backward, i, y, grad)

    def _timed(self, kind: str, i: int, step, *args):
        os.sched_yield()   # the previous op's isend runs on a gloo thread pinned to this core
        start, cpu = time.perf_counter(), time.thread_time()
        out = step(*args)
        self.trace.events.append((kind, i, start, time.perf_counter()))
        self.trace.cpu.append(time.thread_time() - cpu)
        return out
