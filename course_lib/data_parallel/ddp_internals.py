"""What torch's DDP really does in a step: buckets, overlap, bytes, memory (chapter 02).

DDP packs gradients into buckets of about ``bucket_cap_mb`` MiB and all-reduces a bucket as soon
as its last gradient is ready, while backward goes on. :func:`measure_dp` runs real DDP steps on
gloo ranks and measures, per rank: each bucket (a communication hook,
:func:`recording_allreduce_hook`, that records it, then calls torch's ``allreduce_hook``), the
bytes written to sockets (``wchar`` of ``/proc/self/io``, beside :func:`expected_bytes`), memory
with chapter 01's tracker, and the step time. :func:`compare_accumulation` checks ``no_sync()``,
:func:`bucket_overhead` measures the buckets beside ``.grad``, :func:`fits_per_world` answers
"does it fit?" from measured bytes, :func:`dp_explorer` is the widget's run. What each number
means and why gloo on the CPU: docs/modules/data_parallel.md (ddp_internals.py).
"""
# No ``from __future__ import annotations`` here: DDP checks the hook's annotations at runtime
# (``bucket: dist.GradBucket``, returns ``torch.futures.Future[torch.Tensor]``).
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.common.training import make_optimizer
from course_lib.data_parallel.measure import TOLERANCE, max_diff, train_single, validate_dp_run
from course_lib.launcher.launch import run

__all__ = ["BucketLog", "recording_allreduce_hook", "bytes_written", "expected_bytes",
           "DPStepReport", "measure_dp", "compare_accumulation", "bucket_overhead",
           "fits_per_world", "WIDGET_PRESETS", "dp_explorer"]


class BucketLog:
    """State of :func:`recording_allreduce_hook`: one dict per bucket of the current step."""

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        self.process_group = process_group   # None: the default group
        self.records: list[dict] = []
        self.t0 = time.perf_counter()        # set to "backward starts" by the caller

    def start(self) -> None:
        self.records, self.t0 = [], time.perf_counter()


def recording_allreduce_hook(state: BucketLog, bucket: dist.GradBucket
                             ) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook: note the bucket's size and timing, then do torch's default all-reduce."""
    buffer = bucket.buffer()
    record = {"index": bucket.index(), "nbytes": buffer.numel() * buffer.element_size(),
              "n_tensors": len(bucket.gradients()),
              "ready_ms": (time.perf_counter() - state.t0) * 1e3}
    state.records.append(record)

    def finished(fut: torch.futures.Future) -> torch.Tensor:
        record["done_ms"] = (time.perf_counter() - state.t0) * 1e3
        return fut.value()

    return default_hooks.allreduce_hook(state.process_group, bucket).then(finished)


def bytes_written() -> int | None:
    """Bytes this process has written (files, pipes, sockets) so far; None off Linux."""
    try:
        with open("/proc/self/io") as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
    except OSError:
        return None
    return int(fields["wchar"])


def expected_bytes(n_params: int, world: int, bytes_per_grad: int = 4) -> dict[str, float]:
    """The formulas: payload ``4Ψ`` and what each rank sends in a ring all-reduce of it."""
    payload = n_params * bytes_per_grad
    return {"payload": payload, "ring_sent_per_rank": 2 * (world - 1) / world * payload}


@dataclass(frozen=True)
class DPStepReport:
    """One rank's measured DDP step (bytes, milliseconds)."""

    rank: int
    world: int
    n_params: int
    buckets: list[dict]          # the last timed step's buckets, in launch order
    payload_bytes: int           # sum of the buckets' sizes
    sent_bytes: int | None       # bytes written to sockets in one step (median)
    step_ms: float               # median step time
    backward_ms: float           # backward of the step ``buckets`` come from (the last one)
    alive_after_step: int        # everything alive after optimizer.step (tracker)
    peak: int                    # tracker peak
    model_states: int            # params + grads + optimizer as the tracker files them


def _dp_rank(preset: str, local_batch: int, seq_len: int, bucket_cap_mb: float | None,
             view: bool, timed_steps: int) -> DPStepReport:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(GPT(get_config(preset)), bucket_cap_mb=bucket_cap_mb,
                gradient_as_bucket_view=view)
    log = BucketLog()
    model.register_comm_hook(log, recording_allreduce_hook)
    optimizer = make_optimizer(model.parameters(), "adam")
    inputs, targets = get_batch(local_batch, seq_len, seed=0, rank=rank, world_size=world)
    from course_lib.memory.tracker import tracked_steps  # ranks only: it imports torch._dynamo
    # memory first, on the fresh model: DDP (re)builds its buckets inside the tracked steps
    memory = tracked_steps(model, optimizer, (inputs, targets), loss_fn=GPT.loss, iterations=3)
    times, backwards, sent = [], [], []
    for _ in range(timed_steps):
        dist.barrier()
        written, start = bytes_written(), time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = GPT.loss(model(inputs), targets)
        log.start()
        loss.backward()                    # buckets are all-reduced in here, as they fill up
        backwards.append((time.perf_counter() - log.t0) * 1e3)
        optimizer.step()
        times.append((time.perf_counter() - start) * 1e3)
        if written is not None:
            sent.append(bytes_written() - written)
    buckets = sorted(log.records, key=lambda r: r["ready_ms"])
    return DPStepReport(rank, world, memory.n_params, buckets, sum(b["nbytes"] for b in buckets),
                        int(statistics.median(sent)) if sent else None, statistics.median(times),
                        backwards[-1], sum(memory.timeline[-1][1].values()),
                        memory["peak"], memory["model_states"])


def measure_dp(world: int = 2, preset: str = "small", local_batch: int = 4, seq_len: int = 32, *,
               bucket_cap_mb: float | None = None, gradient_as_bucket_view: bool = False,
               timed_steps: int = 3) -> list[DPStepReport]:
    """Measure real DDP steps on ``world`` ranks (one core each); one report per rank.

    ``bucket_cap_mb=None`` keeps DDP's default (25 MiB, first bucket 1 MiB).
    """
    validate_dp_run(world, preset, local_batch=local_batch, seq_len=seq_len, timed_steps=timed_steps)
    if bucket_cap_mb is not None and not (isinstance(bucket_cap_mb, (int, float))
                                          and bucket_cap_mb > 0):
        raise ValueError(f"bucket_cap_mb must be a number > 0 (or None), got {bucket_cap_mb!r}")
    return run(_dp_rank, world, preset, local_batch, seq_len, bucket_cap_mb,
               bool(gradient_as_bucket_view), timed_steps, device="cpu", threads=1)


def _accumulate_rank(micro_steps: int, local_batch: int, seq_len: int, steps: int, lr: float,
                     use_no_sync: bool) -> tuple[dict, list[int | None], dict | None]:
    """DDP with gradient accumulation over ``micro_steps`` micro-batches per optimizer step.

    Rank 0 also trains the one-process reference on the whole global batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(GPT(get_config("tiny")))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    sent = []
    for step in range(steps):
        # this rank's rows of the global batch, cut into micro-batches
        inputs, targets = get_batch(local_batch * micro_steps, seq_len, seed=0, step=step,
                                    rank=rank, world_size=world)
        written = bytes_written()
        optimizer.zero_grad(set_to_none=True)
        for micro in range(micro_steps):
            rows = slice(micro * local_batch, (micro + 1) * local_batch)
            last = micro == micro_steps - 1
            with model.no_sync() if use_no_sync and not last else nullcontext():
                loss = GPT.loss(model(inputs[rows]), targets[rows]) / micro_steps
                loss.backward()            # inside no_sync: gradients only accumulate locally
        optimizer.step()
        sent.append(None if written is None else bytes_written() - written)
    single = train_single(steps, world * micro_steps * local_batch, seq_len, lr=lr,
                          preset="tiny")[0] if rank == 0 else None
    return {n: p.detach().clone() for n, p in model.module.named_parameters()}, sent, single


def compare_accumulation(world: int = 2, micro_steps: int = 4, local_batch: int = 2,
                         seq_len: int = 32, steps: int = 2, lr: float = 0.1) -> dict:
    """DDP + ``no_sync`` accumulation vs one process on the whole batch, and bytes per step.

    The global batch is ``world × micro_steps × local_batch`` rows. Returns max differences of
    the weights (with and without ``no_sync``) against one process, the ranks' spread, and the
    bytes rank 0 sent per optimizer step in both cases.
    """
    validate_dp_run(world, "tiny", local_batch=local_batch, seq_len=seq_len, micro_steps=micro_steps)
    out = {"world": world, "micro_steps": micro_steps,
           "global_batch": world * micro_steps * local_batch}
    for use_no_sync in (True, False):
        ranks = run(_accumulate_rank, world, micro_steps, local_batch, seq_len, steps, lr,
                    use_no_sync, device="cpu", threads=1)
        single = ranks[0][2]
        key = "no_sync" if use_no_sync else "sync_every_micro_batch"
        out[key] = {"vs_single": max_diff(ranks[0][0], single),
                    "ranks_spread": max(max_diff(r[0], ranks[0][0]) for r in ranks),
                    "sent_bytes_per_step": ranks[0][1][-1]}
    out["tolerance"] = TOLERANCE
    return out


def bucket_overhead(preset: str = "small", world: int = 2) -> dict[str, dict[str, float]]:
    """Everything alive after the optimizer step, with and without ``gradient_as_bucket_view``.

    Returns ``{"buckets beside grads": {...}, "grads as bucket views": {...}}`` with
    ``alive_bytes``, ``bytes_per_param`` and ``peak`` (tracker, rank 0).
    """
    out = {}
    for label, view in (("buckets beside grads", False), ("grads as bucket views", True)):
        r = measure_dp(world, preset, gradient_as_bucket_view=view, timed_steps=1)[0]
        out[label] = {"alive_bytes": r.alive_after_step,
                      "bytes_per_param": r.alive_after_step / r.n_params, "peak": r.peak}
    return out


def fits_per_world(per_rank_bytes: Mapping[int, int], budget_bytes: int) -> dict[int, bool]:
    """For each world size, does the measured per-rank memory fit the per-device budget?"""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) \
            or budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be a positive number of bytes, got {budget_bytes!r}")
    if not per_rank_bytes:
        raise ValueError("per_rank_bytes is empty: pass {world size: measured bytes per rank}")
    return {world: nbytes <= budget_bytes for world, nbytes in sorted(per_rank_bytes.items())}


WIDGET_PRESETS = ("tiny", "small", "medium")


def dp_explorer(world: int = 2, preset: str = "tiny", local_batch: int = 4,
                seq_len: int = 32) -> tuple[list[DPStepReport], dict[str, float]]:
    """One real DDP run: the per-rank reports and the formulas to compare them with."""
    if preset not in WIDGET_PRESETS:
        raise ValueError(f"preset must be one of {WIDGET_PRESETS} here (the rest do not fit "
                         f"a laptop), got {preset!r}")
    reports = measure_dp(world, preset, local_batch, seq_len, timed_steps=2)
    return reports, expected_bytes(reports[0].n_params, world)
