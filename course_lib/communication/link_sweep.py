"""The interconnect, measured: one training step over a fast and a slow link (chapter 5).

:func:`link_sweep` runs the same step (a small MLP, DDP or FSDP/ZeRO-3, SGD) on two "nodes": two
processes, each in a network namespace of its own, joined by a veth pair, while ``tc`` shapes the
link (a token bucket for the rate, ``netem`` for a delay). Per (rate, strategy) it returns the
measured step time, the bytes each node put on the wire (the veth's transmit counter) and the α-β
prediction: the step's compute time (measured, no communication) + ``bytes / rate`` + a delay
per message step, with the backend's own byte cost (on gloo FSDP sends 2× DDP's bytes, not 1.5×).
Namespaces need root or an unprivileged user namespace: :func:`availability` says which works
here, :class:`LinkSweepUnavailable` why not. With 2+ GPUs the same call measures NCCL between
local GPUs (no IP link there, so ``tc`` rates cannot apply).
"""
from __future__ import annotations

import math
import shutil  # noqa: F401 - tests patch shutil.which through this module
import statistics
import sys  # noqa: F401 - tests patch sys.platform through this module
from dataclasses import dataclass
from typing import Sequence

from course_lib.communication.link_sweep_gpu import LINK as GPU_LINK, gpu_results
from course_lib.launcher.netns import LinkUnavailable as LinkSweepUnavailable  # noqa: F401
from course_lib.launcher.netns import availability
from course_lib.launcher.shaped_link import run_pair

__all__ = ["LinkRow", "LinkSweepUnavailable", "link_sweep", "availability", "predicted_bytes",
           "predicted_step", "DEFAULT_SIZES", "SWEEP_STRATEGIES", "STEP_FACTOR"]

SWEEP_STRATEGIES = ("ddp", "fsdp")
#: The MLP (Ψ ≈ 0.98 M parameters, 3.9 MB of fp32 gradients) and the per-rank batch.
DEFAULT_SIZES = (256, 768, 768, 256)
DEFAULT_BATCH = 32
#: Stated tolerance: each measured step within this factor of its α-β prediction, either way
#: (1/3 to 3x). Wide on purpose: on 2 shared cores the unthrottled base itself varies ~2x.
STEP_FACTOR = (1 / 3, 3.0)


@dataclass(frozen=True)
class LinkRow:
    """One (link, strategy) point: measured next to predicted.

    ``step_s``: median over the timed steps of the slower rank's step. ``sent_bytes``: bytes one
    rank sent per step, read from ``bytes_source``. ``base_s``: the same strategy's step on the
    unthrottled link (compute, the framework's own work, and a transfer the veth makes nearly
    free; measured at the start and the end of the sweep, the faster kept). ``compute_s``: the
    local step alone, no communication. ``predicted_s``: ``base_s`` + ``predicted_bytes`` at
    the link rate + a delay per message step (α-β); on the unthrottled link it *is*
    ``base_s``, the reference, not a prediction.
    """

    rate_mbit: float
    latency_ms: float
    strategy: str
    step_s: float
    sent_bytes: float
    predicted_s: float
    predicted_bytes: float
    base_s: float
    compute_s: float
    payload_bytes: dict
    bytes_source: str
    link: str

    @property
    def ratio(self) -> float:
        """Measured / predicted step time."""
        return self.step_s / self.predicted_s


def predicted_bytes(strategy: str, n_params: int, world: int = 2, backend: str = "gloo",
                    bytes_per_param: int = 4) -> float:
    """Bytes one rank sends per step (rings; gloo's reduce-scatter costs an all-reduce)."""
    grads = n_params * bytes_per_param
    ring = (world - 1) / world * grads  # one all-gather or one ring reduce-scatter
    if strategy == "ddp":
        return 2 * ring
    reduce_scatter = 2 * ring if backend == "gloo" else ring
    return 2 * ring + reduce_scatter


def predicted_step(base_s: float, n_bytes: float, rate_mbit: float, latency_ms: float = 0.0,
                   calls: dict | None = None, world: int = 2) -> float:
    """α-β: the step on the unthrottled link + ``n_bytes`` at ``rate_mbit`` + one delay per hop.

    ``base_s`` is measured (compute and everything but the transfer); the link adds
    ``β = 8 / rate`` seconds per byte (0 Mbit/s: unthrottled, nothing added) and ``α`` =
    ``latency_ms`` per message step.
    A ring all-reduce makes ``2(p-1)`` message steps, every other collective ``p-1``; ``calls``
    counts the collectives of one step by type.
    """
    beta = 8 / (rate_mbit * 1e6) if rate_mbit else 0.0
    hops = sum((2 if kind == "all_reduce" else 1) * (world - 1) * count
               for kind, count in (calls or {}).items())
    return base_s + n_bytes * beta + hops * latency_ms / 1e3


def _validate(rates_mbit, strategies, latency_ms, steps) -> tuple[list[float], tuple[str, ...]]:
    if isinstance(rates_mbit, (int, float)):
        raise TypeError("rates_mbit must be a sequence of rates in Mbit/s, e.g. [0, 1000, 100]")
    rates = list(rates_mbit)
    if not rates:
        raise ValueError("rates_mbit is empty: give at least one rate (0 = unthrottled)")
    for rate in rates:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) \
                or rate < 0:
            raise ValueError(f"each rate must be a finite number of Mbit/s >= 0 (0 = unthrottled), "
                             f"got {rate!r}")
    if isinstance(strategies, str):
        strategies = (strategies,)
    strategies = tuple(strategies)
    bad = [s for s in strategies if s not in SWEEP_STRATEGIES]
    if bad or not strategies:
        raise ValueError(f"unknown strategies {bad or strategies!r}; "
                         f"choose from {SWEEP_STRATEGIES}")
    if isinstance(latency_ms, bool) or not isinstance(latency_ms, (int, float)) \
            or not math.isfinite(latency_ms) or latency_ms < 0:
        raise ValueError(f"latency_ms must be a finite number >= 0, got {latency_ms!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    return [float(r) for r in rates], strategies


def _run_hub(mode: str, opts: dict, timeout: float) -> list[dict]:
    """The sweep's phases as jobs of :func:`course_lib.launcher.shaped_link.run_pair`: per
    strategy an untimed first phase (imports, build, warm-up, payload count), then every setting
    (the unthrottled link first and, with others, last: load only adds time); one dict each."""
    settings = list(dict.fromkeys([(0, 0)] + [(r, opts["latency_ms"]) for r in opts["rates"]]))
    if len(settings) > 1:
        settings.append((0, 0))
    phases = [(0, 0, s, 1) for s in opts["strategies"]] + [
        (rate, latency, s, opts["steps"]) for rate, latency in settings for s in opts["strategies"]]
    jobs = [(rate, latency, {"strategy": s, "sizes": opts["sizes"], "batch": opts["batch"],
                             "steps": steps}) for rate, latency, s, steps in phases]
    results = run_pair("course_lib.communication._link_node:sweep_phase", jobs, mode=mode,
                       threads=opts["threads"], pin=False, timeout=timeout, what="the link sweep")
    warm = len(opts["strategies"])
    return [{"rate_mbit": rate, "latency_ms": latency, "strategy": s,
             "ranks": [r["result"] for r in ranks]}
            for (rate, latency, s, _), ranks in zip(phases[warm:], results[warm:])]


def _measured(res: dict) -> tuple[float, float, float | None]:
    """(step_s, compute_s, wire bytes per rank per step or None) of one phase's rank results."""
    ranks, steps = res["ranks"], len(res["ranks"][0]["times"])
    step_s = statistics.median(max(r["times"][i] for r in ranks) for i in range(steps))
    compute_s = max(r["compute_s"] for r in ranks)
    wire = None if ranks[0]["tx"] is None else statistics.mean(r["tx"] for r in ranks) / steps
    return step_s, compute_s, wire


def _fastest_base(lines: list[dict]) -> list[dict]:
    """Keep, per strategy, the faster of the two unthrottled phases (start and end of the run)."""
    keep = {}
    for line in lines:
        if not line["rate_mbit"] and not line["latency_ms"]:
            best = keep.get(line["strategy"])
            if best is None or _measured(line)[0] < _measured(best)[0]:
                keep[line["strategy"]] = line
    return [line for line in lines if (line["rate_mbit"] or line["latency_ms"])
            or keep[line["strategy"]] is line]


def _rows(results: list[dict], n_params: int, backend: str, source: str, link_of) -> list[LinkRow]:
    """Rows of the requested settings; the (0 Mbit/s, 0 ms) phase of each strategy is its base."""
    base = {res["strategy"]: _measured(res)[0] for res in results
            if not res["rate_mbit"] and not res["latency_ms"]}
    rows = []
    for res in results:
        if res.get("baseline_only"):
            continue
        step_s, compute_s, wire = _measured(res)
        payload = res["ranks"][0]["payload"]
        if wire is None:  # no wire counter (NCCL): the share of the payload a ring sends, p = 2
            wire = sum((2 if kind == "all_reduce" else 1) * n / 2 for kind, n in payload.items())
        n_bytes = predicted_bytes(res["strategy"], n_params, backend=backend)
        rows.append(LinkRow(res["rate_mbit"], res["latency_ms"], res["strategy"], step_s, wire,
                            predicted_step(base[res["strategy"]], n_bytes, res["rate_mbit"],
                                           res["latency_ms"], res["ranks"][0]["calls"]),
                            n_bytes, base[res["strategy"]], compute_s, payload, source,
                            link_of(res)))
    return rows


def link_sweep(rates_mbit: Sequence[float], strategies: Sequence[str] = SWEEP_STRATEGIES, *,
               latency_ms: float = 0.0, steps: int = 3, sizes: Sequence[int] = DEFAULT_SIZES,
               batch: int = DEFAULT_BATCH, device: str | None = None,
               timeout: float = 180.0) -> list[LinkRow]:
    """Measure one training step per (rate, strategy) between two nodes; see the module doc.

    ``rates_mbit``: link rates in Mbit/s, 0 = unthrottled; ``latency_ms``: one-way delay added
    to every rate (netem). ``steps`` timed steps follow one warm-up. ``device``: None picks
    CUDA/NCCL with 2+ GPUs, else CPU/gloo in namespaces. Raises ``ValueError`` for bad input
    before anything starts, :class:`LinkSweepUnavailable` when namespaces cannot be made.
    """
    rates, strategies = _validate(rates_mbit, strategies, latency_ms, steps)
    from course_lib import devices
    from course_lib.common.models import MLP, mlp_param_count

    MLP(list(sizes))  # raises a clear ValueError for bad sizes
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"device must be None, 'cpu' or 'cuda', got {device!r}")
    n_params = mlp_param_count(list(sizes))
    if device == "cuda" and devices.gpu_count() < 2:
        raise ValueError(f"device='cuda' needs 2 GPUs (one per NCCL rank); this machine has "
                         f"{devices.gpu_count()}. Use device='cpu' (two namespaces)")
    if device == "cuda" or (device is None and devices.gpu_count() >= 2):
        results = gpu_results(rates, strategies, latency_ms, steps, list(sizes), batch, timeout)
        return _rows(results, n_params, "nccl", "CommCounter payload (ring share)",
                     lambda res: GPU_LINK)
    mode, reason = availability(latency=latency_ms > 0)
    if mode is None:
        raise LinkSweepUnavailable(reason)
    opts = {"sizes": list(sizes), "batch": batch, "steps": steps, "rates": rates,
            "latency_ms": latency_ms, "strategies": list(strategies),
            "threads": max(1, devices.cpu_count() // 2)}
    lines = _fastest_base(_run_hub(mode, opts, timeout))
    for line in lines:  # the hub measures the unthrottled base even when 0 is not asked for
        line["baseline_only"] = (line["rate_mbit"], line["latency_ms"]) not in \
            {(r, latency_ms) for r in rates}

    def link_of(res: dict) -> str:
        rate = f"{res['rate_mbit']:g} Mbit/s" if res["rate_mbit"] else "unthrottled"
        return f"veth {rate}" + (f" +{res['latency_ms']:g} ms" if res["latency_ms"] else "")

    rows = _rows(lines, n_params, "gloo", "veth tx_bytes", link_of)
    return sorted(rows, key=lambda r: (rates.index(r.rate_mbit), strategies.index(r.strategy)))
