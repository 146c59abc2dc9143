"""torch's own pipeline schedules, with the bubble measured: GPipe, 1F1B, interleaved 1F1B, ZB-V.

``torch.distributed.pipelining`` also ships the schedules that shrink chapter 4's bubble.
**Interleaved 1F1B** (Narayanan et al., 2021) gives each rank ``v`` smaller stages (rank r holds
r, r+p, ...): bubble ``(p-1)/(v·m+p-1)``. **ZB-V** (Qi et al., 2024) splits each backward into
the input gradient (B, on the critical path) and the weight gradient (W, deferred into idle
slots); with two stages per rank in a V (r and 2p-1-r) its bubble is zero when F, B and W take
equal time, not the case on a CPU. The bubble is measured, not derived: each rank times torch's
``forward_one_chunk``, ``backward_one_chunk`` and ``backward_weight_one_chunk`` on the shared
monotonic clock; a rank's idle share of the step's span (first action on any rank to the last,
messages in flight included) is its bubble.
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from course_lib.common.checks import positive_int
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.launcher import devices
from course_lib.launcher.launch import give_back_heap, run
from course_lib.launcher.progress import report
from course_lib.pipeline_parallel.bubble import MIN_CORE_SHARE
from course_lib.pipeline_parallel.measure import BUBBLE_CONFIG, _data
from course_lib.pipeline_parallel.schedules import Stage

__all__ = ["TORCH_SCHEDULES", "torch_bubble_formula", "stages_of_rank", "measure_torch_schedule",
           "measure_torch_schedules", "order_record", "order_verdict"]

#: name -> (torch class name, stages per rank)
TORCH_SCHEDULES = {"gpipe": ("ScheduleGPipe", 1), "1f1b": ("Schedule1F1B", 1),
                   "interleaved-1f1b": ("ScheduleInterleaved1F1B", 2),
                   "zb-v": ("ScheduleZBVZeroBubble", 2)}
_TIMED = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


def torch_bubble_formula(schedule: str, p: int, m: int) -> float:
    """Idle fraction when every action costs the same: (p-1)/(v·m+p-1); 0 for ZB-V (F = B = W)."""
    v = TORCH_SCHEDULES[schedule][1]
    return 0.0 if schedule == "zb-v" else (p - 1) / (v * m + p - 1)


def stages_of_rank(schedule: str, rank: int, p: int) -> list[int]:
    """The stage indices one rank holds: looped (r, r+p) for interleaved, a V (r, 2p-1-r) for ZB-V."""
    v = TORCH_SCHEDULES[schedule][1]
    if schedule == "zb-v":
        return [rank, 2 * p - 1 - rank]
    return [rank + k * p for k in range(v)]


def _timed(stage, log: list, cpu: list) -> None:
    """Wrap the stage's compute actions so each call appends (name@stage, start, end) to ``log``
    and the thread's CPU seconds it took to ``cpu`` (below its wall time: waiting for a core)."""
    for name in _TIMED:
        original = getattr(stage, name)

        def timed(*args, _original=original, _name=name, **kwargs):
            start, cpu_start = time.perf_counter(), time.thread_time()
            try:
                return _original(*args, **kwargs)
            finally:
                log.append((f"{_name}@{stage.stage_index}", start, time.perf_counter()))
                cpu.append(time.thread_time() - cpu_start)
        setattr(stage, name, timed)


def _torch_schedules_rank(config: GPTConfig, schedules: tuple[str, ...], m: int, batch: int,
                          steps: int, seed: int) -> dict:
    """Inside a rank: each schedule in turn (one launch for all), each from the same seed;
    rank 0 reports how many schedules are done (the notebook's progress line)."""
    out = {}
    for k, name in enumerate(schedules):
        out[name] = _torch_schedule_rank(config, name, m, batch, steps, seed)
        give_back_heap(collect=True)  # in a pod, the next schedule starts from a smaller heap
        if dist.get_rank() == 0:
            report(k + 1, len(schedules))
    return out


def _torch_schedule_rank(config: GPTConfig, schedule: str, m: int, batch: int, steps: int,
                         seed: int) -> dict:
    import torch.distributed.pipelining as pipelining
    from torch.distributed.pipelining import PipelineStage
    rank, p = dist.get_rank(), dist.get_world_size()
    kind, v = TORCH_SCHEDULES[schedule]
    n_stages = p * v
    torch.manual_seed(seed)
    model = GPT(config)
    mine = stages_of_rank(schedule, rank, p)
    modules = [Stage(model, s, n_stages) for s in mine]
    log: list = []
    cpu: list = []
    stages = [PipelineStage(mod, s, n_stages, torch.device("cpu")) for mod, s in zip(modules, mine)]
    for st in stages:
        _timed(st, log, cpu)
    cls = getattr(pipelining, kind)
    sched = cls(stages if v > 1 else stages[0], n_microbatches=m, loss_fn=GPT.loss)
    idx, targets = _data(config, batch, seed)
    spans, losses, actions, shares = [], [], [], []
    for step in range(steps + 1):              # step 0 warms up (first-touch costs), unrecorded
        for mod in modules:
            mod.zero_grad(set_to_none=True)
        log.clear()
        cpu.clear()
        losses = []
        dist.barrier()
        args = (idx,) if 0 in mine else ()
        kwargs = {"target": targets, "losses": losses} if n_stages - 1 in mine else {}
        sched.step(*args, **kwargs)
        if step:
            spans.append([(a, b) for _, a, b in log])
            shares.append(sum(cpu) / max(sum(b - a for _, a, b in log), 1e-9))
            actions = list(log)          # the last recorded step, named: the 09 timeline
    grads = {mod.global_name(n): q.grad.clone() for mod in modules for n, q in mod.named_parameters()}
    loss = torch.stack(losses).mean().item() if losses else None
    return {"rank": rank, "stages": mine, "spans": spans, "grads": grads, "loss": loss,
            "actions": actions, "core_share": min(1.0, statistics.median(shares))}


def measure_torch_schedule(schedule: str = "interleaved-1f1b", p: int = 2, m: int = 4,
                           config: GPTConfig | str = BUBBLE_CONFIG, micro_batch: int = 16,
                           steps: int = 5, seed: int = 0, timeout: float = 120.0) -> dict:
    """Run torch's ``schedule`` on ``p`` ranks (one thread each) and measure its bubble.

    Returns ``bubble`` (the median over ``steps`` recorded steps of the mean idle share of the
    ranks), ``bubbles`` (every step), ``formula`` (:func:`torch_bubble_formula`), ``loss`` and
    ``grads`` (every parameter's gradient under its unsplit name, averaged over micro-batches),
    ``actions`` (per rank, the last step's ``(action@stage, start, end)``, perf_counter seconds),
    for a check against :func:`course_lib.pipeline_parallel.measure.dense_reference`.
    """
    return measure_torch_schedules((schedule,), p, m, config, micro_batch, steps, seed,
                                   timeout)[schedule]


def measure_torch_schedules(schedules=tuple(TORCH_SCHEDULES), p: int = 2, m: int = 4,
                            config: GPTConfig | str = BUBBLE_CONFIG, micro_batch: int = 16,
                            steps: int = 5, seed: int = 0, timeout: float = 120.0) -> dict:
    """:func:`measure_torch_schedule` for several schedules in ONE launch (one after the other
    in the same ranks, each with its own warm-up step): ``{schedule: report}``."""
    schedules = tuple(schedules)
    config = get_config(config)
    for value, name in ((p, "p"), (m, "m"), (micro_batch, "micro_batch"), (steps, "steps")):
        positive_int(value, name)
    for schedule in schedules:
        if schedule not in TORCH_SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; choose one of {sorted(TORCH_SCHEDULES)}")
        n_stages = p * TORCH_SCHEDULES[schedule][1]
        if p < 2 or config.n_layer % n_stages:
            raise ValueError(f"{schedule} on p={p} ranks needs {n_stages} stages: p must be >= 2 "
                             f"and {n_stages} must divide the {config.n_layer} layers")
    if m < p:
        raise ValueError(f"m={m} micro-batches: torch's schedules need at least p={p}")
    load = os.getloadavg()[0]          # before the launch: other work on this machine
    per_rank = run(_torch_schedules_rank, p, config, schedules, m, m * micro_batch, steps, seed,
                   timeout=timeout, threads=1)
    return {name: {**_report(name, p, m, steps, [r[name] for r in per_rank]), "load": load}
            for name in schedules}


def order_record(reports: dict) -> list[dict]:
    """The JSON-plain part of :func:`measure_torch_schedules`' reports that :func:`order_verdict`
    reads, one row per schedule, with the usable cores they were measured on."""
    keep = ("schedule", "p", "m", "bubble", "bubbles", "formula", "load", "core_share")
    return [{**{k: r[k] for k in keep if k in r}, "cores": devices.cpu_count()}
            for r in reports.values()]


def order_verdict(reports: dict, cores: int | None = None) -> str:
    """One line from :func:`measure_torch_schedules`' reports: do the measured bubbles fall in the
    formulas' order? No verdict where the ranks outnumber the cores, or had a core for less than
    ``MIN_CORE_SHARE`` of their compute time (thread CPU / wall of their actions): they then
    waited for a core, not for each other. A record without that share (made before it was
    measured) is judged by the 1-minute load before its launch instead."""
    rows = sorted(reports.values(), key=lambda r: -r["formula"])
    cores = devices.cpu_count() if cores is None else cores
    p, load = rows[0]["p"], max(r.get("load", 0.0) for r in rows)
    line = ("bubble measured " + ", ".join(f"{r['schedule']} {r['bubble']:.2f}" for r in rows)
            + "; formulas " + ", ".join(f"{r['formula']:.2f}" for r in rows))
    if cores < p:
        return f"{line}: no verdict — {p} ranks on {cores} usable cores share them"
    if all("core_share" in r for r in rows):
        share = min(r["core_share"] for r in rows)
        if share < MIN_CORE_SHARE:
            return (f"{line}: no verdict — the ranks had a core for only {share:.0%} of their "
                    f"compute time (threshold {MIN_CORE_SHARE:.0%}): other programs held the cores")
    elif load > max(1.0, cores - p + 0.5):
        return (f"{line}: no verdict — load {load:.1f} on {cores} cores before the launch "
                f"(the {p} ranks were not sure to have a core each)")
    if all(a["bubble"] > b["bubble"] for a, b in zip(rows, rows[1:])):
        return f"{line}: falling in the formulas' order"
    return f"{line}: NOT falling in the formulas' order"


def _report(schedule: str, p: int, m: int, steps: int, results: list[dict]) -> dict:
    bubbles = []
    for k in range(steps):
        events = [r["spans"][k] for r in results]
        start = min(a for ev in events for a, _ in ev)
        span = max(b for ev in events for _, b in ev) - start
        bubbles.append(sum(1 - sum(b - a for a, b in ev) / span for ev in events) / p)
    grads = {n: g for r in results for n, g in r["grads"].items()}
    loss = next(r["loss"] for r in results if r["loss"] is not None)
    return {"schedule": schedule, "p": p, "m": m, "bubble": sorted(bubbles)[len(bubbles) // 2],
            "core_share": min(r["core_share"] for r in results),
            "bubbles": bubbles, "formula": torch_bubble_formula(schedule, p, m),
            "loss": loss, "grads": grads, "actions": [r["actions"] for r in results]}
