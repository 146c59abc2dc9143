"""DDP step time against world size: strong and weak scaling, compute vs communication (chapter 05).

Each world size runs on real ranks (:func:`course_lib.run`) with DDP around the course MLP; every
rank measures (medians, the slowest rank counts) ``step_s`` (a normal step), ``compute_s`` (the
same inside ``no_sync()``: no all-reduce), ``allreduce_s`` (one all-reduce as large as all
gradients) and ``compute_cpu_s``. ``sync_s = step_s - compute_s`` is what DDP's synchronisation
added; ``comm_s = sync_s - reducer_s`` (the 1-rank sync: DDP's own work) what backward could not
hide; ``core_wait_s = compute_s - compute_cpu_s / threads`` is time spent waiting for a core.
``pin=True`` gives every rank its own cores. Strong scaling fixes the global batch (ideal
``T(1)/p``), weak scaling the per-rank batch (ideal ``T(1)``). Ranks get ``cores // p`` threads
(at least 1): on 2 cores, 4 ranks share them. The formulas and what the hardware allows:
docs/modules/communication.md (scaling.py).
"""
from __future__ import annotations

import math
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.checks import is_int
from course_lib.common.models import MLP, mlp_param_count
from course_lib.launcher import devices
from course_lib.launcher.devices import pin_cores  # noqa: F401 - its home before chapter 04 used it
from course_lib.launcher.launch import run

__all__ = ["ScalingRow", "measure_scaling", "format_scaling", "scaling_cause", "DEFAULT_SIZES"]

#: A 1.6 M-parameter MLP (6.3 MB of fp32 gradients): a step takes tens of ms on 2 cores.
DEFAULT_SIZES = (256, 1024, 1024, 256)


@dataclass(frozen=True)
class ScalingRow:
    """One world size of a scaling experiment (times in seconds)."""

    mode: str
    world: int
    threads: int
    batch_per_rank: int
    step_s: float
    compute_s: float
    allreduce_s: float
    speedup: float
    efficiency: float
    compute_cpu_s: float = math.nan   # CPU seconds of the compute-only step (the process's)
    pinned: bool = False
    reducer_s: float = 0.0            # the same mode's 1-rank sync: DDP's own work, no partner

    @property
    def core_wait_s(self) -> float:
        """Time the compute-only step waited for a core: wall - CPU / threads (>= 0)."""
        return max(0.0, self.compute_s - self.compute_cpu_s / self.threads)

    @property
    def sync_s(self) -> float:
        """What DDP's gradient synchronisation added to the step: step - no_sync step (>= 0)."""
        return max(0.0, self.step_s - self.compute_s)

    @property
    def comm_s(self) -> float:
        """Exposed communication: the sync beyond DDP's own work on one rank (0 on one rank)."""
        return 0.0 if self.world == 1 else max(0.0, self.sync_s - self.reducer_s)


def _ddp_rank(sizes: Sequence[int], batches: Sequence[int], steps: int,
              seed: int, pin: bool = False) -> list[tuple[float, float, float, float]]:
    """On each rank, per batch size: median (step, no_sync step, bare all-reduce, CPU of the
    no_sync step) seconds, the maximum over ranks. One process serves all batch sizes
    (building DDP costs seconds)."""
    rank = dist.get_rank()
    if pin:
        pin_cores(rank, torch.get_num_threads())
    torch.manual_seed(seed)  # same initial weights everywhere (DDP would broadcast them anyway)
    model = DDP(MLP(sizes))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    flat = torch.zeros(mlp_param_count(sizes))
    gen = torch.Generator().manual_seed(seed + 1 + rank)
    results = []
    for batch in batches:
        x = torch.randn(batch, sizes[0], generator=gen)
        y = torch.randn(batch, sizes[-1], generator=gen)

        def step(sync: bool) -> float:
            start, cpu = time.perf_counter(), time.process_time()
            with nullcontext() if sync else model.no_sync():
                F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            if not sync:
                times["compute_cpu"].append(time.process_time() - cpu)
            return time.perf_counter() - start

        def bare() -> float:
            start = time.perf_counter()
            dist.all_reduce(flat)
            return time.perf_counter() - start

        times: dict[str, list[float]] = {"step": [], "compute": [], "allreduce": [],
                                         "compute_cpu": []}
        step(True), step(False), bare()  # warm-up
        times["compute_cpu"].clear()
        for _ in range(steps):  # interleaved, so a noisy moment hits all three alike
            for name, fn in (("step", lambda: step(True)), ("compute", lambda: step(False)),
                             ("allreduce", bare)):
                dist.barrier()
                times[name].append(fn())
        medians = torch.tensor([statistics.median(times[k]) for k in ("step", "compute",
                                                                     "allreduce", "compute_cpu")],
                               dtype=torch.float64)
        dist.all_reduce(medians, op=dist.ReduceOp.MAX)
        results.append(tuple(medians.tolist()))
    return results


def measure_scaling(worlds: Sequence[int] = (1, 2, 4), global_batch: int = 128,
                    batch_per_rank: int = 64, sizes: Sequence[int] = DEFAULT_SIZES,
                    steps: int = 3, seed: int = 0, threads: int | None = None,
                    pin: bool = False) -> list[ScalingRow]:
    """Measure DDP steps at each world size, strong and weak scaling in the same processes.

    Strong scaling splits ``global_batch`` over the ranks; weak scaling gives every rank
    ``batch_per_rank``. ``worlds`` must start with 1 (the baseline). Rows: all strong ones,
    then all weak ones. ``threads`` per rank defaults to ``cores // ranks``; ``threads=1``
    makes every rank one core, the CPU analogue of one GPU per rank (and avoids a 2-thread
    baseline whose threads wait for each other on a busy machine). ``pin=True`` pins each rank
    to its own ``threads`` cores; it needs ``world × threads`` cores for every world size.
    """
    worlds = list(worlds)
    if not worlds or worlds[0] != 1 or any(not is_int(w) or w < 1 for w in worlds):
        raise ValueError(f"worlds must be integers >= 1 starting with 1 (the baseline), "
                         f"got {worlds}")
    if steps < 1 or batch_per_rank < 1 or global_batch < 1:
        raise ValueError("steps, global_batch and batch_per_rank must be >= 1")
    # bad requests fail here, before anything starts
    placed = {world: devices.place(world, threads=threads) for world in worlds}
    for world in worlds:
        if global_batch % world:
            raise ValueError(f"global_batch={global_batch} must divide evenly over {world} ranks")
        need = world * placed[world].threads
        if pin and need > devices.usable_cores():
            raise ValueError(f"pin=True gives every rank its own cores: {world} ranks need "
                             f"{need} cores, this process may use {devices.usable_cores()} "
                             "(its affinity mask and cgroup CPU quota)")
    MLP(sizes)  # validates the sizes
    measured = {world: run(_ddp_rank, world, list(sizes), [global_batch // world, batch_per_rank],
                           steps, seed, pin, threads=threads)[0] for world in worlds}
    rows = []
    for index, mode in enumerate(("strong", "weak")):
        base = measured[1][index][0]
        reducer = max(0.0, measured[1][index][0] - measured[1][index][1])  # 1 rank: no partner
        for world in worlds:
            step_s, compute_s, allreduce_s, compute_cpu_s = measured[world][index]
            ratio = base / step_s
            speedup, efficiency = (ratio, ratio / world) if mode == "strong" \
                else (ratio * world, ratio)
            batch = global_batch // world if mode == "strong" else batch_per_rank
            rows.append(ScalingRow(mode, world, placed[world].threads, batch, step_s, compute_s,
                                   allreduce_s if world > 1 else 0.0, speedup, efficiency,
                                   compute_cpu_s, pin, reducer))
    return rows


def format_scaling(rows: Sequence[ScalingRow]) -> str:
    """The rows as a text table (milliseconds), one labelled block per mode."""
    titles = {"strong": "strong scaling: the global batch is split over the ranks (ideal: "
                        "step time / ranks)",
              "weak": "weak scaling: every rank keeps its batch (ideal: the same step time)"}
    header = (f"{'ranks':>5}{'threads':>8}{'batch/rank':>11}{'step ms':>9}{'compute':>9}"
              f"{'cpu':>7}{'core wait':>10}{'sync':>6}{'comm':>6}{'bare AR':>8}{'speedup':>8}"
              f"{'effic.':>7}")
    lines = []
    for mode in dict.fromkeys(r.mode for r in rows):
        lines += ([""] if lines else []) + [titles.get(mode, mode), header]
        for r in (r for r in rows if r.mode == mode):
            lines.append(f"{r.world:>5}{r.threads:>8}{r.batch_per_rank:>11}"
                         f"{r.step_s * 1e3:>9.1f}{r.compute_s * 1e3:>9.1f}"
                         f"{r.compute_cpu_s * 1e3:>7.1f}{r.core_wait_s * 1e3:>10.1f}"
                         f"{r.sync_s * 1e3:>6.1f}{r.comm_s * 1e3:>6.1f}"
                         f"{r.allreduce_s * 1e3:>8.1f}{r.speedup:>8.2f}{r.efficiency:>7.0%}")
    return "\n".join(lines)


def scaling_cause(rows: Sequence[ScalingRow], world: int = 2) -> str:
    """One line: what kept strong scaling at ``world`` ranks from the ideal, from the rows.

    The shortfall ``T(p) - T(1)/p`` is split into compute that did not shrink with the batch
    (``compute - wait`` at p ranks against ``(compute - wait) / p`` of one), time waiting for a
    core, DDP's own per-step work (the 1-rank sync: bucket copies, paid with no partner) and the
    communication the step could not hide; the largest is named.
    """
    strong = {r.world: r for r in rows if r.mode == "strong"}
    if 1 not in strong or world not in strong:
        return f"no strong-scaling row for {world} ranks: nothing to explain"
    one, many = strong[1], strong[world]
    parts = {"compute that did not shrink with the batch":  # on the cores, waits taken out
             max(0.0, (many.compute_s - many.core_wait_s)
                 - (one.compute_s - one.core_wait_s) / world),
             "waiting for a core": many.core_wait_s,
             "DDP's own work (its 1-rank sync)": min(many.sync_s, many.reducer_s),
             "communication the step could not hide": many.comm_s}
    cause = max(parts, key=parts.get)
    return (f"{world} ranks: speedup {many.speedup:.2f} (ideal {world}); compute "
            f"{one.compute_s * 1e3:.1f} → {many.compute_s * 1e3:.1f} ms (ideal "
            f"{one.compute_s / world * 1e3:.1f}), exposed communication {many.comm_s * 1e3:.1f}"
            f" ms; the largest loss: {cause} ({parts[cause] * 1e3:.1f} ms)")
