"""Strong scaling, 1 vs 2 pinned ranks, as the link slows: measured beside α-β (chapter 05).

:func:`scaling_over_link` runs two ranks pinned to cores of their own, joined by a shaped link
(:func:`course_lib.launcher.shaped_link.run_pair`). Rank 0 times the global batch alone (``t1_s``,
the baseline); both ranks time torch's DDP step on half the batch (``t2_s``) and the bare
all-reduce of all gradients (``allreduce_s``), per link rate, interleaved; medians, the slower
rank's. ``speedup = t1 / t2``. The α-β prediction never uses ``t2``: compute ``t1/2``, plus the
unthrottled all-reduce and ``4Ψ·8 / rate`` seconds on the wire. No overlap gives
``t1/2 + comm``, perfect overlap ``max(t1/2, comm)``; a speedup outside that band is reported as
outside, by how much, with no widening (docs/decisions/communication.md, "Why the scaling verdict
uses α-β's own band").
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

__all__ = ["scaling_over_link", "scaling_rank", "format_scaling_link", "scaling_verdict",
           "within_band", "band_gap", "core_shares", "MIN_CORE_SHARE", "LINK_SIZES",
           "LINK_BATCH", "LINK_RATES"]

#: 0.26 M parameters (1 MB of fp32 gradients: 42 ms at 200 Mbit/s); a global batch of 4096
#: keeps one idle core busy ~70 ms, so that the unshaped link scales almost ideally.
LINK_SIZES = (256, 512, 256)
LINK_BATCH = 4096
LINK_RATES = (0.0, 1000.0, 200.0)
#: Below this CPU / wall share of the 1-rank step the machine is too busy for the lesson.
MIN_CORE_SHARE = 0.8


def scaling_rank(sizes: Sequence[int], global_batch: int, steps: int, seed: int = 0,
                 cache: dict | None = None) -> dict:
    """One job on each rank, ``steps`` rounds, interleaved so that a noisy moment hits all
    three alike: the 1-rank baseline (rank 0 alone, the whole batch; rank 1 waits), DDP on half
    the batch, the bare all-reduce. Median seconds, the maximum over ranks."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from course_lib.common.models import MLP

    rank, world = dist.get_rank(), dist.get_world_size()
    if "models" not in cache:
        gen = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(global_batch, sizes[0], generator=gen)
        y = torch.randn(global_batch, sizes[-1], generator=gen)
        torch.manual_seed(seed)
        alone, model = MLP(list(sizes)), DDP(MLP(list(sizes)))
        cache["models"] = (x, y, alone, torch.optim.SGD(alone.parameters(), lr=1e-3), model,
                           torch.optim.SGD(model.parameters(), lr=1e-3),
                           torch.zeros(sum(p.numel() for p in model.parameters())))
    x, y, alone, opt1, model, opt, flat = cache["models"]
    half = global_batch // world
    xs, ys = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]

    def one() -> None:
        opt1.zero_grad(set_to_none=False)
        F.mse_loss(alone(x), y).backward()
        opt1.step()

    def two() -> None:
        opt.zero_grad(set_to_none=False)
        F.mse_loss(model(xs), ys).backward()
        opt.step()

    times: dict[str, list[float]] = {"t1_s": [], "t2_s": [], "allreduce_s": [], "t1_cpu": [],
                                     "t2_cpu": []}
    for round_ in range(steps + 1):  # the first round is a warm-up, on this link
        for name, fn in (("t1_s", one), ("t2_s", two),
                         ("allreduce_s", lambda: dist.all_reduce(flat))):
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            if name != "t1_s" or rank == 0:
                fn()
            if round_:
                times[name].append(time.perf_counter() - start)
                if name in ("t1_s", "t2_s"):
                    times[name[:2] + "_cpu"].append(time.process_time() - cpu)
    medians = {k: statistics.median(v) for k, v in times.items()}
    worst = torch.tensor([medians[k] for k in ("t1_s", "t2_s", "allreduce_s", "t1_cpu")],
                         dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # rank 1's t1 is ~0: rank 0's counts
    out = dict(zip(("t1_s", "t2_s", "allreduce_s", "t1_cpu"), worst.tolist()))
    out["core_share"] = min(1.0, out.pop("t1_cpu") / out["t1_s"])  # CPU / wall of pure compute
    # The 2-rank step's CPU / wall on each rank, the lower: a rank that lost its core to other
    # programs (or waited for a partner that did) shows it here, where t1's share cannot.
    share2 = torch.tensor([min(1.0, medians["t2_cpu"] / medians["t2_s"])], dtype=torch.float64)
    dist.all_reduce(share2, op=dist.ReduceOp.MIN)
    out["t2_core_share"] = share2.item()
    return out


def scaling_over_link(rates_mbit: Sequence[float] = LINK_RATES, steps: int = 5, *,
                      sizes: Sequence[int] = LINK_SIZES, global_batch: int = LINK_BATCH,
                      timeout: float = 120.0) -> list[dict]:
    """One row per rate (0 = unshaped): measured ``t1_s``, ``t2_s``, ``allreduce_s``,
    ``speedup`` and the α-β ``predicted_speedup_serial`` / ``predicted_speedup_overlap``."""
    from course_lib.common.checks import positive_int
    from course_lib.common.models import MLP, mlp_param_count
    from course_lib.launcher.shaped_link import run_pair

    rates = [float(r) for r in rates_mbit]
    if not rates or rates[0] != 0 or any(r < 0 for r in rates):
        raise ValueError(f"rates_mbit must start with 0 (the unshaped link: α-β's base) and be "
                         f">= 0 Mbit/s, got {list(rates_mbit)!r}")
    positive_int(steps, "steps")
    MLP(list(sizes))
    if positive_int(global_batch, "global_batch") % 2:
        raise ValueError(f"global_batch={global_batch} must split evenly over 2 ranks")
    jobs = [(rate, {"sizes": list(sizes), "global_batch": global_batch, "steps": steps})
            for rate in rates]
    results = run_pair("course_lib.communication.scaling_link:scaling_rank", jobs,
                       timeout=timeout)
    base_ar = results[0][0]["result"]["allreduce_s"]
    wire_bytes = 4 * mlp_param_count(list(sizes))  # a ring at p = 2 sends the payload once
    rows = []
    for rate, ranks in zip(rates, results):
        r = ranks[0]["result"]
        t1 = r["t1_s"]  # measured in the same rounds as this link's t2
        comm = base_ar + (wire_bytes * 8 / (rate * 1e6) if rate else 0.0)
        rows.append({"rate_mbit": rate, "t1_s": t1, "t2_s": r["t2_s"],
                     "allreduce_s": r["allreduce_s"], "speedup": t1 / r["t2_s"],
                     "core_share": r["core_share"], "t2_core_share": r["t2_core_share"],
                     "predicted_comm_s": comm,
                     "predicted_speedup_serial": t1 / (t1 / 2 + comm),
                     "predicted_speedup_overlap": t1 / max(t1 / 2, comm),
                     "cores": [x["cores"] for x in ranks], "shared_core": ranks[0]["shared_core"]})
    return rows


def band_gap(row: dict) -> float:
    """How far the measured speedup lies outside the α-β band, as a fraction of the nearer end:
    negative below the no-overlap end, positive above the perfect-overlap end, 0 inside."""
    low, high, speedup = (row["predicted_speedup_serial"], row["predicted_speedup_overlap"],
                          row["speedup"])
    if speedup < low:
        return speedup / low - 1
    if speedup > high:
        return speedup / high - 1
    return 0.0


def within_band(row: dict) -> bool:
    """The measured speedup lies in the α-β band, unwidened."""
    return band_gap(row) == 0.0


def format_scaling_link(rows: Sequence[dict]) -> str:
    """A table: per link, measured speedup beside the α-β band."""
    lines = [f"{'link':>12}{'1 rank ms':>10}{'2 ranks ms':>11}{'bare AR ms':>11}{'speedup':>9}"
             f"{'α-β: serial … overlap':>24}"]
    for r in rows:
        link = f"{r['rate_mbit']:g} Mbit/s" if r["rate_mbit"] else "unshaped"
        lines.append(f"{link:>12}{r['t1_s'] * 1e3:>10.1f}{r['t2_s'] * 1e3:>11.1f}"
                     f"{r['allreduce_s'] * 1e3:>11.1f}{r['speedup']:>9.2f}"
                     f"{r['predicted_speedup_serial']:>15.2f} … "
                     f"{r['predicted_speedup_overlap']:.2f}")
    return "\n".join(lines)


def core_shares(rows: Sequence[dict]) -> list[float]:
    """The measured CPU / wall shares that say whether the ranks had their cores: the 1-rank
    step's on every link, and the 2-rank step's on the unshaped one (on a shaped link a rank
    also waits for the wire, which is no sign of a busy machine). A stored run without the
    2-rank share gives the 1-rank ones."""
    return [r["core_share"] for r in rows] + [rows[0].get("t2_core_share", 1.0)]


def scaling_verdict(rows: Sequence[dict]) -> str:
    """One line: does the speedup fall as the link slows, within the α-β band?"""
    speedups = " → ".join(f"{r['speedup']:.2f}" for r in rows)
    links = " → ".join(f"{r['rate_mbit']:g}" if r["rate_mbit"] else "unshaped" for r in rows)
    head = f"speedup {speedups} as the link went {links} Mbit/s: "
    if rows[0].get("shared_core"):
        return head + ("both ranks shared one core, so 2 ranks could not compute faster than "
                       "1: this needs 2 usable cores, see the stored run")
    share = min(core_shares(rows))
    if share < MIN_CORE_SHARE:
        return head + (f"the ranks had their core only {share:.0%} of the time (< "
                       f"{MIN_CORE_SHARE:.0%}): other programs took the cores, so this measures "
                       "that competition, not the link; rerun on a quiet machine")
    falls = all(a["speedup"] > b["speedup"] for a, b in zip(rows, rows[1:]))
    gaps = [band_gap(r) for r in rows]
    where = ", ".join("inside" if not g else f"{-g:.0%} below" if g < 0 else f"{g:.0%} above"
                      for g in gaps)
    trend = "falls as the link slows" if falls else "does not fall monotonically"
    if falls and not any(gaps):
        return head + f"{trend}, each inside its α-β band: as predicted"
    return head + f"{trend}; against the α-β band: {where} — not as predicted"
