"""A layout's step time, from its counted FLOPs and the bytes its collectives send (chapter 05).

Compute: the FLOPs the fake step counted on the busiest rank, at ``efficiency`` × the GPU's
peak. Communication: each collective the fake step made (FSDP's all-gathers and
reduce-scatters, HSDP's all-reduce, TP's all-reduces and all-gathers) is timed with chapter 05's
ring α-β model (:func:`course_lib.communication.formulas.ring_allreduce_time`; an all-gather or a
reduce-scatter is half a ring all-reduce) over the link its group crosses: NVLink inside a node,
the NIC between nodes. Three messages the fake step cannot send are added from their shapes and
labelled: context parallelism's ring of K/V chunks, expert parallelism's all-to-all (routing
assumed balanced) and the pipeline's activations between stages. Overlap is the strategy's:
FSDP/HSDP and the K/V ring hide behind compute (prefetch), TP's and EP's collectives sit on the
critical path (no async TP), and 1F1B adds its bubble, ``(pp - 1) / microbatches`` of a step.
"""
from __future__ import annotations

import dataclasses

from course_lib.communication.formulas import ring_allreduce_time
from course_lib.common.dtypes import BF16
from course_lib.plan.clusters import Cluster
from course_lib.plan.layouts import Candidate

__all__ = ["StepTime", "collective_seconds", "step_time"]


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds of one step on the busiest rank, by part; ``total`` what the plan uses."""

    compute: float
    hidden_comm: float      # overlapped with compute (FSDP, HSDP, CP ring)
    exposed_comm: float     # on the critical path (TP, EP, pipeline sends)
    bubble: float
    total: float


def collective_seconds(kind: str, n_bytes: float, ranks: tuple[int, ...], calls: int,
                       cluster: Cluster) -> float:
    """α-β time of ``calls`` ring collectives moving ``n_bytes`` in all over the group ``ranks``."""
    p = len(ranks)
    if p < 2 or n_bytes <= 0:
        return 0.0
    nodes = {r // cluster.gpus_per_node for r in ranks}
    inter = len(nodes) > 1
    alpha = (cluster.internode_alpha_us if inter else cluster.nvlink_alpha_us) * 1e-6 * max(calls, 1)
    beta = 1e-9 / (cluster.internode_gbps if inter else cluster.nvlink_gbps)
    full = ring_allreduce_time(n_bytes, p, alpha, beta)
    return full if kind == "all_reduce" else full / 2


def _crosses(stride: int, size: int, cluster: Cluster) -> bool:
    return stride * size > cluster.gpus_per_node


def step_time(c: Candidate, spec, cluster: Cluster, *, flops: float, comm: dict,
              micro_batch: int, seq_len: int, microbatches: int, efficiency: float) -> StepTime:
    """The step of layout ``c`` whose busiest rank counts ``flops`` and ``comm``
    (``{(kind, ranks): (bytes, calls)}``), ``microbatches`` of ``micro_batch`` sequences."""
    compute = flops / (cluster.peak_tflops * 1e12 * efficiency)
    tp_group = tuple(range(c.tp))
    hidden = exposed = 0.0
    for (kind, ranks), (n_bytes, calls) in comm.items():
        t = collective_seconds(kind, n_bytes, ranks, calls, cluster)
        if ranks == tp_group:
            exposed += t
        else:
            hidden += t
    layers = -(-spec.layers // c.pp)
    tokens = micro_batch * seq_len // c.cp
    link = lambda inter: (cluster.internode_gbps if inter else cluster.nvlink_gbps) * 1e9  # noqa: E731
    if c.cp > 1:   # ring attention: K and V chunks go round cp - 1 times forward, with dK, dV back
        kv = 2 * tokens * spec.kv_heads // c.tp * spec.head_dim * BF16
        ring = layers * microbatches * 3 * kv * (c.cp - 1)
        hidden += ring / link(_crosses(c.tp, c.cp, cluster))
    if c.ep > 1:   # dispatch and combine, forward and backward; balanced routing
        a2a = layers * microbatches * 4 * tokens * spec.top_k * spec.hidden * BF16 * (c.ep - 1) / c.ep
        exposed += a2a / link(_crosses(c.tp, c.fsdp, cluster))
    bubble = 0.0
    if c.pp > 1:   # one activation forward and its gradient back per microbatch
        send = 2 * microbatches * tokens * spec.hidden * BF16
        inter = _crosses(c.world // c.pp, c.pp, cluster)
        exposed += send / link(inter) + 2 * microbatches * (cluster.internode_alpha_us if inter
                                                            else cluster.nvlink_alpha_us) * 1e-6
    busy = max(compute, hidden) + exposed
    if c.pp > 1:
        bubble = busy * (c.pp - 1) / microbatches
    return StepTime(compute, hidden, exposed, bubble, busy + bubble)
