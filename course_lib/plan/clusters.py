"""Cluster presets: a GPU's memory, peak dense bf16 FLOP/s and links, each figure with its source.

A :class:`Cluster` is what the planner needs of a machine: GPUs per node, memory per GPU, the
peak dense (not sparse) bf16 tensor-core rate, and an α-β pair (chapter 05's model) for the link
inside a node (NVLink through NVSwitch) and between nodes (one RDMA NIC per GPU). Bandwidths are
per GPU and per direction, as the datasheets give them (NVLink's "900 GB/s" is both directions
together: 450 GB/s each way); the latencies α are assumptions, printed with every plan.
"""
from __future__ import annotations

import dataclasses

__all__ = ["Cluster", "CLUSTERS", "get_cluster"]

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Cluster:
    """One kind of GPU node; ``*_gbps`` in GB/s (1e9 bytes/s) per GPU and direction."""

    name: str
    memory_gib: float
    peak_tflops: float
    nvlink_gbps: float
    internode_gbps: float
    gpus_per_node: int = 8
    nvlink_alpha_us: float = 5.0
    internode_alpha_us: float = 10.0
    source: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GiB)


_H100 = ("NVIDIA H100 datasheet (https://www.nvidia.com/en-us/data-center/h100/): SXM 80 GB, "
         "BF16 tensor core 1,979 TFLOPS with sparsity = 989 dense, NVLink 900 GB/s (both "
         "directions); DGX H100 user guide (https://docs.nvidia.com/dgx/dgxh100-user-guide/"
         "introduction-to-dgxh100.html): one 400 Gb/s ConnectX-7 NIC per GPU = 50 GB/s")
CLUSTERS = {
    "h100-80gb": Cluster("H100 SXM 80 GB (DGX H100)", memory_gib=79.6, peak_tflops=989.0,
                         nvlink_gbps=450.0, internode_gbps=50.0, source=_H100 + "; 79.6 GiB is "
                         "the 81,559 MiB nvidia-smi reports"),
    "h100-94gb": Cluster("H100 NVL 94 GB (PCIe, NVLink bridge)", memory_gib=93.0, peak_tflops=835.0,
                         nvlink_gbps=300.0, internode_gbps=50.0, source="NVIDIA H100 datasheet: "
                         "NVL 94 GB, BF16 1,671 TFLOPS with sparsity = 835 dense, NVLink bridge "
                         "600 GB/s (both directions; pairs of GPUs only: the planner treats it as "
                         "a node-wide switch, which flatters tp > 2); 400 Gb/s NIC per GPU assumed"),
    "h100-96gb": Cluster("H100 96 GB HBM2e (Grand Teton, 500 W; torchtitan's benchmarks)",
                         memory_gib=95.0, peak_tflops=989.0, nvlink_gbps=450.0,
                         internode_gbps=50.0, source="torchtitan benchmarks/llama3_h100_202412_"
                         "torchtitan.md: 8 H100 per host fully connected with NVLink, 96 GB HBM2e "
                         "(95 GiB), 400 Gb/s RDMA per GPU, 500 W; its peak lies between SXM and NVL "
                         "and is unknown, so torchtitan (and this preset) uses the SXM 989 TFLOP/s"),
    "a100-80gb": Cluster("A100 SXM 80 GB (DGX A100)", memory_gib=80.0, peak_tflops=312.0,
                         nvlink_gbps=300.0, internode_gbps=25.0, source="NVIDIA A100 datasheet "
                         "(https://www.nvidia.com/en-us/data-center/a100/): BF16 312 TFLOPS dense, "
                         "80 GB HBM2e, NVLink 600 GB/s (both directions); DGX A100 user guide: one "
                         "200 Gb/s HDR NIC per GPU = 25 GB/s"),
}


def get_cluster(cluster: str | Cluster, gpus_per_node: int | None = None, memory_gib: float | None = None) -> Cluster:
    """A preset by key (or a :class:`Cluster`), with GPUs per node or memory per GPU overridden."""
    if isinstance(cluster, str):
        if cluster not in CLUSTERS:
            raise ValueError(f"unknown cluster {cluster!r}; presets: {', '.join(CLUSTERS)}")
        cluster = CLUSTERS[cluster]
    changes = {}
    if gpus_per_node is not None:
        changes["gpus_per_node"] = gpus_per_node
    if memory_gib is not None:
        changes["memory_gib"] = float(memory_gib)
    return dataclasses.replace(cluster, **changes) if changes else cluster
