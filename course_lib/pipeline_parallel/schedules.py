"""Pipeline parallelism by hand: stages, GPipe and 1F1B with send/recv (chapter 4).

The GPT's blocks are cut into ``p`` consecutive **stages**, one per process; the first stage also
owns the embeddings, the last one ``ln_f``, ``lm_head`` and the loss. A batch is cut into ``m``
**micro-batches** that flow through the stages like parts on an assembly line:

* **GPipe**: every micro-batch forward, then every micro-batch backward. Simple, but each stage
  keeps the activations of all ``m`` micro-batches until their backward.
* **1F1B**: after ``p - rank - 1`` warm-up forwards, each stage alternates one forward and one
  backward, so it never holds more than ``p - rank`` micro-batches' activations. Same bubble.

Both leave stages idle while the pipeline fills and drains: the **bubble**, a fraction
``(p-1)/(m+p-1)`` of the step when all micro-batches cost the same. :func:`run_schedule` records
when each forward/backward ran and each blocking receive waited (``time.perf_counter``, plus
the CPU time of each operation) and how many bytes of activations were stashed, so chapter 4
can measure both instead of quoting them.
Sends use ``dist.isend`` (a stage never waits for its neighbour to be ready to receive — that
would deadlock 1F1B); receives block. :mod:`course_lib.pipeline_parallel.measure` splits that waiting
into bubble (the input did not exist yet) and transfer (it was sent, not yet received).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from course_lib.common.checks import positive_int
from course_lib.common.models import GPT, GPTConfig

__all__ = ["Stage", "check_pipeline", "schedule_ops", "SCHEDULES", "StageTrace", "run_schedule"]

SCHEDULES = ("gpipe", "1f1b")


def check_pipeline(config: GPTConfig, p: int, m: int, batch: int | None = None,
                   schedule: str = "gpipe") -> None:
    """Raise ``ValueError`` for a pipeline that cannot be built (before any process starts)."""
    for name, value in (("p (stages)", p), ("m (micro-batches)", m), ("batch", 1 if batch is None else batch)):
        positive_int(value, f"{name}")
    if config.n_layer % p:
        raise ValueError(f"p={p} stages do not divide n_layer={config.n_layer}: every stage "
                         f"must get the same number of blocks")
    if batch is not None and batch % m:
        raise ValueError(f"m={m} micro-batches do not divide batch={batch}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


class Stage(nn.Module):
    """Stage ``index`` of ``p``: blocks ``[index·n/p, (index+1)·n/p)`` of ``model`` (shared, not copied).

    This is the model-code change pipeline parallelism needs: ``GPT.forward`` runs embeddings,
    all blocks and the head in one process; a stage runs only its part, and what it gets and
    returns depends on where it sits (token ids in, logits out, or activations in between).
    """

    def __init__(self, model: GPT, index: int, p: int) -> None:
        super().__init__()
        per = model.config.n_layer // p
        self.first, self.last, self.offset = index == 0, index == p - 1, index * per
        self.blocks = nn.ModuleList(model.blocks[self.offset:self.offset + per])
        if self.first:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        if self.last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:                       # x: token ids (b, s)
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.size(1), device=x.device))
        for block in self.blocks:            # x: activations (b, s, h)
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x

    def global_name(self, name: str) -> str:
        """The name this parameter has in the unsplit :class:`GPT` (``blocks.j`` → ``blocks.offset+j``)."""
        if name.startswith("blocks."):
            _, j, rest = name.split(".", 2)
            return f"blocks.{self.offset + int(j)}.{rest}"
        return name


def schedule_ops(schedule: str, p: int, m: int, rank: int) -> list[tuple[str, int]]:
    """The order in which stage ``rank`` runs forwards ("F", i) and backwards ("B", i)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - rank - 1, m)
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):              # steady state: one forward, one backward
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warmup, m)]   # cool-down


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


def run_schedule(stage: Stage, schedule: str, micro_inputs: list, micro_targets: list,
                 act_shape: tuple[int, ...], trace: StageTrace,
                 ops: Callable[[str, int, int, int], list] = schedule_ops) -> None:
    """Run one training step of ``schedule`` on this rank, appending to ``trace``.

    ``micro_inputs``/``micro_targets`` are used by the first/last stage only; ``act_shape`` is the
    shape of the activations passed between stages. Gradients accumulate in ``stage``'s
    parameters, each micro-batch's loss scaled by ``1/m`` (so they equal the full batch's).
    ``ops(schedule, p, m, rank)`` gives the order (:func:`schedule_ops`, or a notebook's copy).
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    m = len(micro_inputs)
    stash: dict[int, tuple] = {}                     # micro-batch -> (input, output, bytes)
    sends, losses = [], []
    for kind, i in ops(schedule, p, m, rank):
        if kind == "F":
            if stage.first:
                x = micro_inputs[i]
            else:
                x = torch.empty(act_shape)
                start = time.perf_counter()
                dist.recv(x, src=rank - 1)           # waiting here is idle time
                trace.waits.append(("F", i, start, time.perf_counter()))
                x.requires_grad_()
            saved: dict = {}
            start, cpu = time.perf_counter(), time.thread_time()
            with _saved_bytes(stage, saved):
                y = stage(x)
                if stage.last:
                    y = GPT.loss(y, micro_targets[i]) / m
            trace.events.append(("F", i, start, time.perf_counter()))
            trace.cpu.append(time.thread_time() - cpu)
            if stage.last:
                losses.append(y.item())
            else:
                sends.append((dist.isend(y.detach(), dst=rank + 1), y))
            stash[i] = (x, y, sum(saved.values()))
            trace.stash_peak_count = max(trace.stash_peak_count, len(stash))
            trace.stash_peak_bytes = max(trace.stash_peak_bytes, sum(s[2] for s in stash.values()))
        else:
            x, y, _ = stash.pop(i)
            grad = None
            if not stage.last:
                grad = torch.empty(act_shape)
                start = time.perf_counter()
                dist.recv(grad, src=rank + 1)
                trace.waits.append(("B", i, start, time.perf_counter()))
            start, cpu = time.perf_counter(), time.thread_time()
            torch.autograd.backward(y, grad)
            trace.events.append(("B", i, start, time.perf_counter()))
            trace.cpu.append(time.thread_time() - cpu)
            if not stage.first:
                sends.append((dist.isend(x.grad, dst=rank - 1), x))
    for work, _ in sends:
        work.wait()
    if stage.last:
        trace.loss = sum(losses)
