"""The link sweep on GPUs: NCCL between two local GPUs (NVLink or PCIe) — the real link only.

NCCL moves GPU memory over NVLink or PCIe (or, between machines, InfiniBand/RoCE), not over an
IP interface, so there is nothing for ``tc`` to throttle and no ``tx_bytes`` counter to read:
:func:`gpu_results` runs the same steps as the CPU sweep on ``cuda:0`` and ``cuda:1`` through
:func:`course_lib.run` (one process per GPU, NCCL), returns one row per strategy at the real
link (``rate_mbit`` 0) and warns that the requested rates and delay were not applied. The bytes
come from :class:`~course_lib.sharding.comm_counter.CommCounter` (the ring's share of each collective's
payload); what changes against the CPU table: compute shrinks by orders of magnitude, the link
is 10-100× faster than the veth, and NCCL's reduce-scatter brings FSDP's bytes to 1.5× DDP's.
"""
from __future__ import annotations

import warnings
from typing import Sequence

LINK = "NCCL, 2 local GPUs (NVLink or PCIe)"


def _rank(strategies: list[str], steps: int, sizes: list[int], batch: int) -> dict:
    import torch
    import torch.distributed as dist

    from course_lib.communication._link_node import strategy_phase

    device = f"cuda:{dist.get_rank()}"
    torch.cuda.set_device(device)
    return {s: strategy_phase(s, sizes, batch, steps, 0, None, device) for s in strategies}


def _launch(strategies: list[str], steps: int, sizes: list[int], batch: int,
            timeout: float) -> list[dict]:
    from course_lib.launcher.launch import run

    return run(_rank, 2, strategies, steps, sizes, batch, backend="nccl", device="cuda",
               timeout=timeout)


def gpu_results(rates: Sequence[float], strategies: Sequence[str], latency_ms: float, steps: int,
                sizes: list[int], batch: int, timeout: float) -> list[dict]:
    """Per-strategy results at the real GPU link (rate 0), in the hub's format (rows are made by
    :func:`course_lib.communication.link_sweep.link_sweep`); rates/delay cannot apply (see above)."""
    if any(rates) or latency_ms:
        warnings.warn("on GPUs the sweep measures NCCL over the real NVLink/PCIe link only: "
                      "tc can throttle an IP interface, not NVLink or PCIe, so the rates "
                      f"{[r for r in rates if r]} Mbit/s and latency_ms={latency_ms:g} were not "
                      "applied", stacklevel=3)
    per_rank = _launch(list(strategies), steps, sizes, batch, timeout)
    return [{"rate_mbit": 0.0, "latency_ms": 0.0, "strategy": s,
             "ranks": [r[s] for r in per_rank]} for s in strategies]
