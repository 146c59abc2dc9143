"""What-if for real clusters: step time and scaling efficiency from the α-β model (chapter 5).

The model fitted on this machine (:mod:`course_lib.communication.alphabeta`) runs with real
interconnects' figures (:data:`LINKS`, per GPU and direction: the vendors' and standards'
bandwidths; the latencies α are order-of-magnitude assumptions, not measurements) to predict one
data-parallel step of a ``Ψ``-parameter model on ``p`` GPUs. Per GPU a step moves ``k = 2`` Ψ
elements for DDP, ZeRO-1 and ZeRO-2 and ``k = 3`` for ZeRO-3/FSDP (ZeRO paper §7, ring
collectives): ``T_comm = k(p-1)·α·buckets + k(p-1)/p · Ψ·b·β``, in 25 MiB buckets (DDP's
``bucket_cap_mb``). Compute: ``6·Ψ`` FLOPs per token (Kaplan et al. 2020) at a fraction ``mfu``
of peak; ``overlap`` is the share of compute that can hide communication (at most ~2/3).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.common.checks import positive_int

__all__ = ["Link", "LINKS", "STRATEGIES", "StepPrediction", "predict_step", "whatif_table"]


@dataclass(frozen=True)
class Link:
    """One interconnect: per-GPU unidirectional bandwidth (GB/s), latency α (s), source."""

    name: str
    bandwidth_gbps: float
    alpha: float
    source: str = ""

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1e-9 / self.bandwidth_gbps


LINKS: dict[str, Link] = {link.name: link for link in (
    Link("NVLink 4 (H100)", 450.0, 3e-6,
         "NVIDIA H100 Tensor Core GPU datasheet: NVLink 900 GB/s per GPU, both directions "
         "together (18 links x 50 GB/s) -> 450 GB/s each way"),
    Link("PCIe 5.0 x16", 63.0, 5e-6,
         "PCI-SIG PCI Express Base Specification 5.0: 32 GT/s x 16 lanes, 128b/130b "
         "-> ~63 GB/s per direction"),
    Link("PCIe 4.0 x16", 31.5, 5e-6,
         "PCI-SIG PCI Express Base Specification 4.0: 16 GT/s x 16 lanes, 128b/130b "
         "-> ~31.5 GB/s per direction"),
    Link("InfiniBand NDR (400 Gb/s)", 50.0, 5e-6,
         "NVIDIA ConnectX-7 / Quantum-2 NDR: 400 Gb/s per port = 50 GB/s, one NIC per GPU"),
    Link("InfiniBand HDR (200 Gb/s)", 25.0, 5e-6,
         "NVIDIA ConnectX-6 / Quantum HDR: 200 Gb/s per port = 25 GB/s, one NIC per GPU"),
    Link("100 GbE", 12.5, 20e-6,
         "IEEE 802.3 100 Gb/s Ethernet: 12.5 GB/s per port (TCP stacks add latency)"),
)}

#: elements communicated per parameter per step, in units of Ψ (before the (p-1)/p factor)
STRATEGIES: dict[str, int] = {"ddp": 2, "zero1": 2, "zero2": 2, "zero3": 3, "fsdp": 3}


@dataclass(frozen=True)
class StepPrediction:
    """Predicted seconds per step and what they are made of."""

    gpus: int
    strategy: str
    link: str
    compute_s: float
    comm_s: float
    step_s: float
    comm_bytes_per_gpu: float

    @property
    def efficiency(self) -> float:
        """Weak-scaling efficiency: compute / step (1.0 = communication fully hidden or free)."""
        return self.compute_s / self.step_s

    @property
    def speedup(self) -> float:
        """Throughput relative to one GPU with the same per-GPU batch (``gpus x efficiency``)."""
        return self.gpus * self.efficiency


def _resolve(link: str | Link) -> Link:
    if isinstance(link, Link):
        return link
    if link not in LINKS:
        raise ValueError(f"unknown link {link!r}; choose from {sorted(LINKS)} or pass a Link")
    return LINKS[link]


def predict_step(params: float, gpus: int, strategy: str = "ddp",
                 link: str | Link = "NVLink 4 (H100)", *, tokens_per_gpu: int = 8 * 2048,
                 bytes_per_element: int = 2, peak_tflops: float = 989.0, mfu: float = 0.4,
                 overlap: float = 0.0, gpus_per_node: int = 8,
                 inter_node: str | Link = "InfiniBand NDR (400 Gb/s)",
                 bucket_mib: float = 25.0) -> StepPrediction:
    """Predict one data-parallel step of a ``params``-parameter model on ``gpus`` GPUs.

    ``peak_tflops`` defaults to an H100 SXM's dense bf16 figure (989 TFLOPS, NVIDIA datasheet).
    Beyond ``gpus_per_node`` GPUs the ring also crosses ``inter_node`` links, and a ring runs at
    the speed of its slowest link: the slower of the two is used.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {sorted(STRATEGIES)}")
    if params <= 0 or tokens_per_gpu <= 0 or bytes_per_element <= 0:
        raise ValueError("params, tokens_per_gpu and bytes_per_element must be positive")
    positive_int(gpus, "gpus")
    if not (0 < mfu <= 1 and 0 <= overlap <= 1 and peak_tflops > 0 and bucket_mib > 0):
        raise ValueError("need 0 < mfu <= 1, 0 <= overlap <= 1, peak_tflops > 0, bucket_mib > 0")
    chosen = _resolve(link)
    if gpus > gpus_per_node:
        other = _resolve(inter_node)
        chosen = min(chosen, other, key=lambda lk: lk.bandwidth_gbps)
    compute = 6 * params * tokens_per_gpu / (peak_tflops * 1e12 * mfu)
    k = STRATEGIES[strategy]
    data = params * bytes_per_element
    buckets = max(1, math.ceil(data / (bucket_mib * 2**20)))
    sent = k * (gpus - 1) / gpus * data
    comm = k * (gpus - 1) * chosen.alpha * buckets + sent * chosen.beta
    step = compute + max(0.0, comm - overlap * compute)
    return StepPrediction(gpus, strategy, chosen.name, compute, comm, step, sent)


def whatif_table(params: float, strategy: str = "ddp", link: str | Link = "NVLink 4 (H100)",
                 gpu_counts: tuple[int, ...] = (1, 2, 8, 64, 512), **options: float) -> str:
    """A text table of :func:`predict_step` over ``gpu_counts``."""
    lines = [f"{params / 1e9:.2f} B params, {strategy}, {_resolve(link).name}",
             f"{'GPUs':>6}{'compute ms':>12}{'comm ms':>10}{'step ms':>10}{'efficiency':>12}"
             f"{'speedup':>9}  link used"]
    for gpus in gpu_counts:
        pred = predict_step(params, gpus, strategy, link, **options)
        lines.append(f"{gpus:>6}{pred.compute_s * 1e3:>12.1f}{pred.comm_s * 1e3:>10.1f}"
                     f"{pred.step_s * 1e3:>10.1f}{pred.efficiency:>11.0%}{pred.speedup:>9.1f}"
                     f"  {pred.link}")
    return "\n".join(lines)
