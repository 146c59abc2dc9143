"""How much communication DDP's bucketed overlap hides, measured over a slow link (chapter 02).

:func:`measure_overlap` runs two pinned ranks joined by a shaped link
(:mod:`course_lib.launcher.shaped_link`), so the gradients take real wire time (``rate_mbit``)
while the CPU stays free for backward. Every rank times, interleaved, medians over ``steps``,
the slower rank's: the step with no communication (``compute_s``: ``no_sync``), the all-reduce
of all gradients alone (``comm_s``), torch's DDP step, whose buckets (``bucket_cap_mb``) are
all-reduced while backward goes on (``step_overlapped_s``), and the same step with one
all-reduce after backward (``step_serial_s``: ``no_sync`` backward, then ``dist.all_reduce`` of
all gradients flattened). Each is a timer's reading; ``exposed_comm_s = overlapped - compute``
and ``hidden_share = 1 - exposed / comm`` are derived from them. The model predicts the serial
step at compute + comm and the overlapped one at no less than max(compute, comm).
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Sequence

from course_lib.common.checks import positive_int

__all__ = ["measure_overlap", "overlap_verdict", "OVERLAP_SIZES", "OVERLAP_BATCH", "overlap_rank",
           "MIN_CORE_SHARE"]

#: A 5-layer MLP, 1.05 M parameters (4.2 MB of fp32 gradients: 67 ms at 500 Mbit/s); a
#: batch of 1024 takes about as long to compute on one idle core (~6 GFLOP).
OVERLAP_SIZES = (256, 512, 512, 512, 512, 256)
OVERLAP_BATCH = 1024
#: Below this CPU / wall share of the compute-only step the machine is too busy for the lesson.
MIN_CORE_SHARE = 0.8


def overlap_rank(sizes: Sequence[int], batch: int, steps: int, bucket_cap_mb: float,
                 seed: int = 0, cache: dict | None = None) -> dict:
    """On each rank: median seconds of the four timings (see the module doc), max over ranks."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from course_lib.common.models import MLP

    torch.manual_seed(seed)
    model = DDP(MLP(list(sizes)), bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    params = [p for p in model.parameters()]
    gen = torch.Generator().manual_seed(seed + 1 + dist.get_rank())
    x, y = torch.randn(batch, sizes[0], generator=gen), torch.randn(batch, sizes[-1], generator=gen)
    flat = torch.zeros(sum(p.numel() for p in params))

    def backward(sync: bool) -> None:
        opt.zero_grad(set_to_none=False)
        if sync:
            F.mse_loss(model(x), y).backward()  # DDP's buckets go out during backward
        else:
            with model.no_sync():
                F.mse_loss(model(x), y).backward()

    def compute() -> None:
        backward(False)
        opt.step()

    def overlapped() -> None:
        backward(True)
        opt.step()

    def serial() -> None:
        backward(False)
        torch.cat([p.grad.view(-1) for p in params], out=flat)
        dist.all_reduce(flat)  # one all-reduce, after backward
        flat.div_(dist.get_world_size())
        offset = 0
        for p in params:
            p.grad.view(-1).copy_(flat[offset:offset + p.numel()])
            offset += p.numel()
        opt.step()

    def comm() -> None:
        dist.all_reduce(flat)

    kinds = {"compute_s": compute, "comm_s": comm, "step_overlapped_s": overlapped,
             "step_serial_s": serial}
    for fn in kinds.values():  # warm-up: DDP builds its buckets in the first steps
        fn(), fn()
    times: dict[str, list[float]] = {k: [] for k in [*kinds, "compute_cpu"]}
    for _ in range(steps):  # interleaved: a noisy moment hits all four alike
        for name, fn in kinds.items():
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            if name == "compute_s":
                times["compute_cpu"].append(time.process_time() - cpu)
    medians = [statistics.median(v) for v in times.values()]
    share = torch.tensor([min(1.0, medians[-1] / medians[0])], dtype=torch.float64)
    medians = torch.tensor(medians[:-1], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    dist.all_reduce(share, op=dist.ReduceOp.MIN)
    out = dict(zip(kinds, medians.tolist()))
    out["core_share"] = share.item()  # CPU / wall of the compute-only step, the lower rank's
    return out


def _derived(m: dict) -> dict:
    exposed = max(0.0, m["step_overlapped_s"] - m["compute_s"])
    hidden = min(1.0, max(0.0, 1 - exposed / m["comm_s"])) if m["comm_s"] > 0 else math.nan
    return {**m, "exposed_comm_s": exposed, "hidden_share": hidden,
            "predicted_serial_s": m["compute_s"] + m["comm_s"],
            "predicted_overlapped_floor_s": max(m["compute_s"], m["comm_s"])}


def measure_overlap(rate_mbit: float = 500.0, bucket_cap_mb: float = 1.0, steps: int = 5, *,
                    sizes: Sequence[int] = OVERLAP_SIZES, batch: int = OVERLAP_BATCH,
                    timeout: float = 120.0) -> dict:
    """Overlapped vs serial DDP step on 2 pinned ranks over a ``rate_mbit`` link (0 = unshaped).

    Returns the four measured times (seconds) with ``exposed_comm_s``, ``hidden_share``, the
    predictions, ``rate_mbit``, ``bucket_cap_mb``, ``n_params``, ``cores`` (each rank's) and
    ``shared_core`` (fewer than 2 usable cores: both ranks on one). Bad input raises
    ``ValueError`` before anything starts; no namespace here raises
    :class:`~course_lib.launcher.netns.LinkUnavailable`.
    """
    from course_lib.common.models import MLP, mlp_param_count
    from course_lib.launcher.shaped_link import run_pair

    for name, value in (("rate_mbit", rate_mbit), ("bucket_cap_mb", bucket_cap_mb)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0 or (name == "bucket_cap_mb" and not value):
            raise ValueError(f"{name} must be a finite number {'> 0' if name[0] == 'b' else '>= 0'}"
                             f" (Mbit/s or MB), got {value!r}")
    positive_int(steps, "steps")
    positive_int(batch, "batch")
    MLP(list(sizes))  # validates the sizes
    ranks = run_pair("course_lib.data_parallel.overlap:overlap_rank",
                     [(rate_mbit, {"sizes": list(sizes), "batch": batch, "steps": steps,
                                   "bucket_cap_mb": bucket_cap_mb})], timeout=timeout)[0]
    out = _derived(ranks[0]["result"])
    out.update(rate_mbit=float(rate_mbit), bucket_cap_mb=float(bucket_cap_mb),
               n_params=mlp_param_count(list(sizes)), cores=[r["cores"] for r in ranks],
               shared_core=ranks[0]["shared_core"])
    return out


def overlap_verdict(m: dict, hidden_at_least: float = 0.25) -> str:
    """One line from a measurement: how much overlap saved against the serial step, how much
    communication stayed exposed (overlapped - compute), and whether the saving reached
    ``hidden_at_least`` of the most the model lets overlap save, min(compute, comm) (= compute +
    comm - max(compute, comm)): a share of comm alone would depend on the CPU's speed, since the
    wire fixes comm and a faster core shortens compute, which bounds what can hide."""
    saved = m["step_serial_s"] - m["step_overlapped_s"]
    most = min(m["compute_s"], m["comm_s"])
    head = (f"overlapped {m['step_overlapped_s']:.2f} s vs serial {m['step_serial_s']:.2f} s "
            f"(compute {m['compute_s']:.2f} s, communication {m['comm_s']:.2f} s): ")
    if m.get("shared_core"):
        return head + ("both ranks shared one core, so backward and the other rank's work "
                       "competed for it: this needs 2 usable cores, see the stored run")
    if m.get("core_share", 1.0) < MIN_CORE_SHARE:
        return head + (f"the ranks had their core only {m['core_share']:.0%} of the time (< "
                       f"{MIN_CORE_SHARE:.0%}): other programs took the cores, so this measures "
                       "that competition, not the overlap; rerun on a quiet machine")
    if saved >= hidden_at_least * most:
        return head + (f"overlap saved {saved * 1e3:.0f} ms, {saved / most:.0%} of the most it "
                       f"could, min(compute, comm) = {most * 1e3:.0f} ms (exposed "
                       f"{m['exposed_comm_s'] * 1e3:.0f} of {m['comm_s'] * 1e3:.0f} ms of "
                       f"communication); predicted between max(compute, comm) = "
                       f"{m['predicted_overlapped_floor_s']:.2f} s and compute + comm = "
                       f"{m['predicted_serial_s']:.2f} s: as predicted")
    return head + (f"overlap saved only {saved:.2f} s (< {hidden_at_least:.0%} of min(compute, "
                   "comm), the most it could): not what the model predicts — a busy machine?")
