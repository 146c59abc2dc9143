"""Run pipelines on real processes and measure them: bubble, activation stash, correctness (chapter 4).

* :func:`measure_pipeline` runs the hand-written schedules of :mod:`course_lib.pipeline_parallel.schedules` on ``p``
  processes (one thread each, so stages do not fight over cores), each stage's steps timed from
  outside (:mod:`~course_lib.pipeline_parallel.trace`), and turns the recorded events into a :class:`PipelineReport`: each rank's time split into compute, transfer (a message
  already sent, not yet received) and bubble (nothing to do: input not produced yet, or done),
  the measured bubble fraction next to ``(p-1)/(m+p-1)``.
* :func:`torch_pipeline` runs the same split with ``torch.distributed.pipelining``
  (``PipelineStage`` + ``ScheduleGPipe``/``Schedule1F1B``); :func:`dense_reference` is the
  unsplit model on the whole batch. The tests hold all three against each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from course_lib.common.checks import positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.launcher.launch import run
from course_lib.pipeline_parallel.formulas import bubble_formula
from course_lib.pipeline_parallel.schedules import (Stage, lay_out, run_schedule, schedule_ops,
                                                    validate_pipeline)
from course_lib.pipeline_parallel.trace import StageTrace, TracedSteps

__all__ = ["PP_CONFIG", "BUBBLE_CONFIG", "PipelineReport", "StepBudget", "bubble_formula",
           "bubble_for_stages", "stage_costs", "measured_bubble", "ready_times", "pipeline_rank",
           "measure_pipeline", "torch_pipeline", "dense_reference"]

#: Small model for correctness checks (4 blocks: p = 1, 2, 4 divide it).
PP_CONFIG = GPTConfig(n_layer=4, n_head=2, d_model=32, seq_len=16)
#: Model for timing: a micro-batch's forward takes ~10 ms here, far above a send/recv (<1 ms).
BUBBLE_CONFIG = GPTConfig(n_layer=4, n_head=4, d_model=256, seq_len=64)


def bubble_for_stages(schedule: str, m: int, forward_s: list, backward_s: list) -> float:
    """The same idle fraction when stage ``r``'s forward and backward of one micro-batch take
    ``forward_s[r]`` and ``backward_s[r]``: the schedule's actions laid out with those costs
    (:func:`~course_lib.pipeline_parallel.schedules.lay_out`). The slowest stage sets the pace:
    GPipe's forward and backward phases each take the sum over the stages plus (m-1) of the
    slowest one; 1F1B's steady state runs at the slowest F + B. Equal stages give
    ``(p-1)/(m+p-1)``."""
    p, total = len(forward_s), sum(forward_s) + sum(backward_s)
    orders = [schedule_ops(schedule, p, m, rank) for rank in range(p)]
    events = lay_out(orders, lambda rank, kind, i: (forward_s if kind == "F" else backward_s)[rank])
    return 1 - m * total / (p * max(end for *_, end in events))


def stage_costs(traces: list[StageTrace]) -> tuple[list, list]:
    """Each rank's mean forward and mean backward of one micro-batch in a recorded step (s)."""
    def mean(t, kind):
        spans = [b - a for k, _, a, b in t.events if k == kind]
        return sum(spans) / len(spans)
    return [mean(t, "F") for t in traces], [mean(t, "B") for t in traces]


@dataclass
class StepBudget:
    """Where each rank's time went during one recorded step (seconds, from the events).

    Every rank is accounted over the same ``span`` (first operation on any rank to the last):

    * ``compute[r]`` — its forward and backward events;
    * ``transfer[r]`` — time blocked in ``recv`` *after* the neighbour had finished producing
      the tensor (the end of its forward/backward event): the message in flight, including the
      time the operating system takes to wake the receiver — communication, not bubble;
    * ``bubble[r]`` — the rest: it had no work because its input did not exist yet (the pipeline
      filling), or it had finished (draining). This is what ``(p-1)/(m+p-1)`` predicts.
    """

    span: float
    compute: list
    transfer: list
    bubble: list

    @property
    def bubble_fraction(self) -> float:
        return sum(self.bubble) / (len(self.bubble) * self.span)

    @property
    def transfer_fraction(self) -> float:
        return sum(self.transfer) / (len(self.transfer) * self.span)


def ready_times(traces: list[StageTrace]) -> dict:
    """When each tensor a stage waits for came into existence: ``(rank, kind, i) -> time``.

    Stage ``r`` waits for the activation of micro-batch ``i`` (before its ``F i``), produced by
    the end of ``F i`` on stage ``r-1``, and for the gradient of ``B i``, produced by the end of
    ``B i`` on stage ``r+1``.
    """
    ends = {(t.rank, k, i): b for t in traces for k, i, _, b in t.events}
    return {(t.rank, k, i): ends[(t.rank - 1 if k == "F" else t.rank + 1, k, i)]
            for t in traces for k, i, _, _ in t.waits}


def measured_bubble(traces: list[StageTrace]) -> StepBudget:
    """Split each rank's share of the step into compute, transfer and bubble (see StepBudget)."""
    start = min(e[2] for t in traces for e in t.events)
    end = max(e[3] for t in traces for e in t.events)
    ready = ready_times(traces)
    compute = [sum(b - a for _, _, a, b in t.events) for t in traces]
    transfer = [sum(max(0.0, b - max(a, start, ready[(t.rank, k, i)])) for k, i, a, b in t.waits)
                for t in traces]
    span = end - start
    return StepBudget(span, compute, transfer, [span - c - x for c, x in zip(compute, transfer)])


@dataclass
class PipelineReport:
    """A measured pipeline step; ``traces`` hold per-rank events relative to the step's start.

    ``bubble`` and ``transfer`` are fractions of ``p · span`` (see :class:`StepBudget`);
    ``bubbles`` lists the bubble of every recorded step (the report shows the median one).
    """

    p: int
    m: int
    schedule: str
    traces: list
    budget: StepBudget
    formula: float
    bubbles: list

    @property
    def bubble(self) -> float:
        return self.budget.bubble_fraction

    @property
    def transfer(self) -> float:
        return self.budget.transfer_fraction

    @property
    def span(self) -> float:
        return self.budget.span

    @property
    def loss(self) -> float:
        return self.traces[-1].loss

    @property
    def cpu_share(self) -> float:
        """CPU seconds over wall seconds of the ranks' compute: below 1 when the machine is shared."""
        return sum(sum(t.cpu) for t in self.traces) / sum(self.budget.compute)

    def summary(self) -> str:
        stash = ", ".join(f"{t.stash_peak_count} ({t.stash_peak_bytes / 2**10:.0f} KiB)" for t in self.traces)
        return (f"{self.schedule}, p={self.p}, m={self.m}: bubble measured {self.bubble:.3f} vs "
                f"formula (p-1)/(m+p-1) = {self.formula:.3f} (transfer {self.transfer:.3f}); "
                f"peak stash per rank: {stash}")


def _data(config: GPTConfig, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return get_batch(batch, config.seq_len, seed=seed)


def pipeline_rank(config: GPTConfig, schedule: str, m: int, batch: int, seed: int = 0,
                  steps: int = 1, warmup: int = 1, grads: bool = True,
                  ops: Callable | None = None) -> list[StageTrace]:
    """Run on every rank: build the GPT from ``seed``, keep this rank's stage, run ``warmup``
    unrecorded steps (first-touch costs) then ``steps`` recorded ones; return their traces.
    ``ops`` replaces :func:`~course_lib.pipeline_parallel.schedules.schedule_ops` (same signature)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    stage = Stage(GPT(config), rank, p)
    idx, targets = _data(config, batch, seed)
    micro_in, micro_tg = list(idx.chunk(m)), list(targets.chunk(m))
    act_shape = (batch // m, config.seq_len, config.d_model)
    traces = []
    for _ in range(warmup + steps):
        stage.zero_grad(set_to_none=True)
        traces.append(StageTrace(rank))
        dist.barrier()
        traces[-1].loss = run_schedule(TracedSteps(stage, micro_tg, traces[-1]), schedule, micro_in,
                                       act_shape, ops or schedule_ops)
    if grads:
        traces[-1].grads = {stage.global_name(n): q.grad.clone() for n, q in stage.named_parameters()}
    return traces[warmup:]


def measure_pipeline(p: int = 2, m: int = 4, schedule: str = "gpipe",
                     config: GPTConfig | str = BUBBLE_CONFIG, micro_batch: int = 4, seed: int = 0,
                     steps: int = 7, grads: bool = False, timeout: float = 120.0,
                     ops: Callable | None = None) -> PipelineReport:
    """Run the hand-written ``schedule`` on ``p`` processes (one thread each) with ``m``
    micro-batches of ``micro_batch`` sequences; bad requests fail before any process starts.
    ``ops(schedule, p, m, rank)`` gives each rank's order of operations: by default the
    library's ``schedule_ops``; pass a notebook cell's copy to run an edited schedule.

    After one warm-up step, ``steps`` short steps are recorded; the report keeps the step whose
    bubble is the median (``bubbles`` lists all of them): one busy moment on a shared machine
    then does not decide the result. The bubble counts idle time only, not messages in flight
    (:class:`StepBudget`).
    """
    config = get_config(config)
    positive_int(micro_batch, "micro_batch")
    positive_int(steps, "steps")
    validate_pipeline(config, p, m, None, schedule)
    if ops is not None and not callable(ops):
        raise TypeError(f"ops must be a function like schedule_ops, got {type(ops).__name__}")
    per_rank = run(pipeline_rank, p, config, schedule, m, m * micro_batch, seed, steps, 1, grads,
                   ops, timeout=timeout, threads=1)
    per_step = [[rank_traces[k] for rank_traces in per_rank] for k in range(steps)]
    measured = [measured_bubble(traces) for traces in per_step]
    order = sorted(range(steps), key=lambda k: measured[k].bubble_fraction)
    pick = order[len(order) // 2] if not grads else steps - 1
    traces = per_step[pick]
    start = min(e[2] for t in traces for e in t.events)
    for t in traces:      # times relative to the step's first operation
        t.events = [(k, i, a - start, b - start) for k, i, a, b in t.events]
        t.waits = [(k, i, max(0.0, a - start), b - start) for k, i, a, b in t.waits]
    return PipelineReport(p, m, schedule, traces, measured_bubble(traces), bubble_formula(p, m),
                          [b.bubble_fraction for b in measured])


def dense_reference(config: GPTConfig | str, batch: int, seed: int = 0) -> tuple[float, dict]:
    """Loss and gradients of the unsplit GPT on the whole batch (one process)."""
    config = get_config(config)
    torch.manual_seed(seed)
    model = GPT(config)
    idx, targets = _data(config, batch, seed)
    loss = GPT.loss(model(idx), targets)
    loss.backward()
    return loss.item(), {n: q.grad.clone() for n, q in model.named_parameters()}


def _recording(method: Callable, kind: str, order: list) -> Callable:
    """``method`` (a stage's forward/backward of chunk ``i``) that first appends ``(kind, i)``."""
    def recorded(i, *args, **kwargs):
        order.append((kind, i))
        return method(i, *args, **kwargs)
    return recorded


def _torch_pipeline_rank(config: GPTConfig, schedule: str, m: int, batch: int, seed: int) -> tuple:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    rank, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    stage = Stage(GPT(config), rank, p)
    pipe_stage = PipelineStage(stage, rank, p, torch.device("cpu"))
    order: list = []     # what torch's schedule ran on this rank: ("F", i) / ("B", i)
    pipe_stage.forward_one_chunk = _recording(pipe_stage.forward_one_chunk, "F", order)
    pipe_stage.backward_one_chunk = _recording(pipe_stage.backward_one_chunk, "B", order)
    kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    sched = kind(pipe_stage, n_microbatches=m, loss_fn=GPT.loss)   # grads averaged over m
    idx, targets = _data(config, batch, seed)
    losses: list = []
    if stage.first:
        sched.step(idx)
    elif stage.last:
        sched.step(target=targets, losses=losses)
    else:
        sched.step()
    loss = torch.stack(losses).mean().item() if losses else None
    return loss, {stage.global_name(n): q.grad.clone() for n, q in stage.named_parameters()}, order


def torch_pipeline(p: int = 2, m: int = 4, schedule: str = "gpipe",
                   config: GPTConfig | str = PP_CONFIG, batch: int = 8, seed: int = 0,
                   timeout: float = 120.0, with_order: bool = False) -> tuple:
    """The same split with ``torch.distributed.pipelining``: (mean loss, all gradients).

    ``with_order=True`` adds a third element: per rank, the ("F", i)/("B", i) order in which
    torch's schedule really ran its stage's forward and backward chunks.
    """
    config = get_config(config)
    validate_pipeline(config, p, m, batch, schedule)
    results = run(_torch_pipeline_rank, p, config, schedule, m, batch, seed, timeout=timeout, threads=1)
    grads = {n: g for _, rank_grads, _ in results for n, g in rank_grads.items()}
    if with_order:
        return results[-1][0], grads, [order for _, _, order in results]
    return results[-1][0], grads
