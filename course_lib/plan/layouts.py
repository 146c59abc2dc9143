"""Every layout of a GPU count: data replicate × shard (FSDP/HSDP), tensor, pipeline, context, expert.

A :class:`Candidate` is one way to place a model on ``world`` GPUs (torchtitan's parallel
dimensions): ``world = dp_replicate · dp_shard · cp · tp · pp``; FSDP shards over ``dp_shard · cp``
(torchtitan's rule), ``ep`` (mixture of experts) borrows ranks from ``dp_shard · cp`` and needs
each rank to hold at least ``top_k`` experts. :func:`enumerate_layouts` lists every candidate
whose sizes divide the GPU count and the model: ``tp`` within a node and dividing the key/value
heads, ``pp`` at most the layer count, ``cp`` within a node beside ``tp`` and at least 4,096
tokens per rank, a global batch the data-parallel ranks can split; HSDP replicates across nodes
with each shard group filling a node's remaining GPUs (the layout HSDP exists for).
"""
from __future__ import annotations

import dataclasses

__all__ = ["AC_MODES", "Candidate", "enumerate_layouts", "divisors"]

#: context parallelism only while each rank keeps this many tokens (below, its K/V ring costs
#: more than the activations it saves; torchtitan's CP runs start at 32k-token sequences)
MIN_CP_TOKENS = 4096
#: activation checkpointing per decoder block: none, torchtitan's selective op policy, full
AC_MODES = ("none", "selective", "full")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One layout: mesh sizes (1 = absent) and the activation checkpointing of every block."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    ac: str = "none"

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp

    @property
    def dp(self) -> int:
        """Ranks reading different sequences of the batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp(self) -> int:
        """Ranks FSDP shards the dense parameters over (``dp_shard · cp``)."""
        return self.dp_shard * self.cp

    @property
    def label(self) -> str:
        parts = []
        if self.dp_replicate > 1:
            parts.append(f"HSDP {self.dp_replicate}×{self.dp_shard}")
        elif self.dp_shard > 1:
            parts.append(f"FSDP {self.dp_shard}")
        for name in ("tp", "pp", "cp", "ep"):
            if getattr(self, name) > 1:
                parts.append(f"{name.upper()} {getattr(self, name)}")
        return " · ".join(parts) or "1 GPU"


def enumerate_layouts(gpus: int, gpus_per_node: int, spec, global_batch: int, seq_len: int,
                      ac_modes: tuple[str, ...] = AC_MODES) -> list[Candidate]:
    """Every candidate for ``gpus`` GPUs, model ``spec`` (a ``ModelSpec``), a global batch of
    ``global_batch`` sequences of ``seq_len`` tokens, × ``ac_modes``."""
    out = []
    for tp in divisors(gpus):
        if gpus_per_node % tp or spec.kv_heads % tp or spec.heads % tp or spec.ffn % tp:
            continue
        for cp in divisors(gpus // tp):
            if tp * cp > gpus_per_node or gpus_per_node % (tp * cp) or seq_len % (2 * cp) \
                    or (cp > 1 and seq_len // cp < MIN_CP_TOKENS):
                continue
            for pp in divisors(gpus // (tp * cp)):
                dp = gpus // (tp * cp * pp)
                if pp > spec.layers or global_batch % dp:
                    continue
                in_node = max(1, gpus_per_node // (tp * cp))
                replicas = {1} | ({dp // in_node} if pp == 1 and dp > in_node and dp % in_node == 0 else set())
                for rep in sorted(replicas):
                    shard = dp // rep
                    eps = [1]
                    if spec.moe:
                        eps = [e for e in divisors(shard * cp)
                               if spec.experts % e == 0 and spec.experts // e >= spec.top_k]
                    for ep in eps:
                        out += [Candidate(rep, shard, cp, tp, pp, ep, ac) for ac in ac_modes]
    return out
