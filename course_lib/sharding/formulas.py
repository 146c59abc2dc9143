"""ZeRO's memory and communication formulas: the paper's and the exact ones for torch's classes.

Chapter 3 puts these next to :func:`course_lib.sharding.measure.measure_distributed`; nothing
here reads a measurement. **The paper** (Rajbhandari et al., SC 2020, Figure 1;
:func:`paper_bytes`, :func:`paper_comm`): mixed-precision Adam is ``(2 + 2 + K)Ψ`` per replica
(K = 12), sharded in stages: DP ``(4+K)Ψ``, ZeRO-1 ``4Ψ + KΨ/N``, ZeRO-2 ``2Ψ + (2+K)Ψ/N``,
ZeRO-3 ``(4+K)Ψ/N``; ``2Ψ`` of communication per step, ``3Ψ`` for ZeRO-3. **What torch does**
(:func:`per_rank_bytes`, :func:`comm_bytes`, from the parameter shapes): fp32 master weights,
grads and Adam states (:func:`ideal_bytes`: 4 + 4 + 8); ``ZeroRedundancyOptimizer`` gives each
rank *whole* parameters greedily (:func:`zero1_assignment`: unequal shares); FSDP2 splits every
parameter along dim 0 like ``torch.chunk`` (``ceil(d0/N)`` rows, the last padded; optimizer
states only for real rows); Adam keeps a 4-byte ``step`` per parameter tensor.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from course_lib.common.deprecation import warn_renamed
from course_lib.common.dtypes import BF16, FP16, FP32
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.common.training import STATES_PER_PARAM

__all__ = ["STAGES", "RENAMED_STRATEGIES", "canonical_strategy", "paper_bytes", "ideal_bytes", "param_shapes", "zero1_assignment", "fsdp_rows",
           "per_rank_bytes", "flat_zero_bytes", "fsdp_peak_saving", "comm_bytes", "paper_comm", "NAMES_IN_THE_WILD"]

#: Strategy name -> the ZeRO stage whose states it shards (0 = plain data parallelism).
#: ``"fsdp_no_reshard"`` is FSDP2's ``fully_shard(reshard_after_forward=False)``: gradients and
#: optimizer states sharded as in ZeRO stage 2, but parameters sharded between steps too (the
#: paper's stage 2 keeps full parameters on every rank).
STAGES = {"ddp": 0, "zero1": 1, "fsdp_no_reshard": 2, "fsdp": 3}
#: Old strategy keys -> the key that replaced them (accepted one release, with a DeprecationWarning).
RENAMED_STRATEGIES = {"zero2": "fsdp_no_reshard"}


def canonical_strategy(strategy: str, stacklevel: int = 3) -> str:
    """``strategy`` itself, or for an old key its replacement, with a ``DeprecationWarning``."""
    new = RENAMED_STRATEGIES.get(strategy) if isinstance(strategy, str) else None
    if new is None:
        return strategy
    warn_renamed(f"strategy {strategy!r}", f"{new!r}: torch's fully_shard(reshard_after_forward=False); "
                 "the paper's ZeRO-2 keeps full parameters on every rank", stacklevel=stacklevel + 1)
    return new
Shape = tuple[int, ...]


def paper_bytes(n_params: float, world: int, k: int = 12) -> dict[str, float]:
    """The paper's per-rank model-state bytes for DP and ZeRO stages 1-3 (fp16 mixed precision)."""
    psi = n_params
    wg = 2 * FP16  # fp16 weights and gradients
    return {"ddp": (wg + k) * psi, "zero1": wg * psi + k * psi / world,
            "zero2": FP16 * psi + (FP16 + k) * psi / world, "fsdp": (wg + k) * psi / world}


def ideal_bytes(n_params: float, world: int, optimizer: str = "adam",
                weight_bytes: int = FP32, grad_bytes: int = FP32,
                state_bytes: int = FP32) -> dict[str, float]:
    """The paper's staging with the sizes our runs use (4 B weights, grads, each state): no padding.

    ``ddp (w+g+k)Ψ``, ``zero1 (w+g)Ψ + kΨ/N``, ``zero2 wΨ + (g+k)Ψ/N``, ``fsdp (w+g+k)Ψ/N`` with
    ``k = states × state_bytes`` (fp32 Adam: w = g = 4, k = 8 — the 16 B rule divided in stages).
    """
    w, g, k, psi = weight_bytes, grad_bytes, STATES_PER_PARAM[optimizer] * state_bytes, n_params
    return {"ddp": (w + g + k) * psi, "zero1": (w + g) * psi + k * psi / world,
            "zero2": w * psi + (g + k) * psi / world, "fsdp": (w + g + k) * psi / world}


def param_shapes(model: nn.Module | GPTConfig | str) -> list[Shape]:
    """Shapes of the trainable parameters in ``model.parameters()`` order (a config: built on meta)."""
    if not isinstance(model, nn.Module):
        with torch.device("meta"):
            model = GPT(get_config(model))
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def zero1_assignment(shapes: Sequence[Shape], world: int) -> list[list[int]]:
    """Indices of the parameters each rank owns under ``ZeroRedundancyOptimizer``.

    Its algorithm: sort by size, largest first (a stable sort: ties keep model order), and give
    each parameter to the rank holding the fewest elements so far (the lowest rank on a tie).
    """
    order = sorted(range(len(shapes)), key=lambda i: _numel(shapes[i]), reverse=True)
    owned: list[list[int]] = [[] for _ in range(world)]
    sizes = [0] * world
    for i in order:
        rank = sizes.index(min(sizes))
        owned[rank].append(i)
        sizes[rank] += _numel(shapes[i])
    return owned


def fsdp_rows(dim0: int, world: int) -> tuple[int, list[int]]:
    """FSDP2's split of ``dim0`` rows: (padded rows per rank, real rows of each rank)."""
    chunk = -(-dim0 // world)
    return chunk, [max(0, min(chunk, dim0 - r * chunk)) for r in range(world)]


def per_rank_bytes(shapes: Sequence[Shape], strategy: str, world: int, optimizer: str = "adam",
                   precision: str = "fp32") -> list[dict[str, int]]:
    """Exact model-state bytes of each rank, as :func:`measure_distributed` should measure them.

    Keys: ``params``, ``grads``, ``optimizer``, ``model_states`` (after the optimizer step) and
    ``unsharded_params`` / ``model_states_fwd`` (at the end of forward: FSDP's gathered full
    parameters — bf16 under "amp" — are alive, the sharded grads were freed by
    ``zero_grad(set_to_none=True)``; DDP's grads live in its buckets and never go away).
    """
    strategy = canonical_strategy(strategy)
    if strategy not in STAGES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {tuple(STAGES)}")
    states = STATES_PER_PARAM[optimizer]
    counter = FP32 if optimizer in ("adam", "adamw") else 0  # Adam's fp32 step, per tensor
    total = sum(_numel(s) for s in shapes)
    if strategy not in ("ddp", "zero1"):  # each shape's split once, not once per rank
        splits = [(fsdp_rows(s[0] if s else 1, world), _numel(s[1:]) if s else 1) for s in shapes]
    out = []
    for rank in range(world):
        if strategy in ("ddp", "zero1"):
            mine = range(len(shapes)) if strategy == "ddp" else zero1_assignment(shapes, world)[rank]
            owned = sum(_numel(shapes[i]) for i in mine)
            row = {"params": FP32 * total, "grads": FP32 * total,
                   "optimizer": FP32 * states * owned + counter * len(mine), "unsharded_params": 0}
            row["model_states_fwd"] = row["params"] + row["grads"] + row["optimizer"]
        else:
            padded = real = 0
            for (chunk, rows), rest in splits:
                padded += chunk * rest
                real += rows[rank] * rest
            full = (BF16 if precision in ("amp", "mixed") else FP32) * padded * world
            row = {"params": FP32 * padded, "grads": FP32 * padded,
                   "optimizer": FP32 * states * real + counter * len(shapes),
                   "unsharded_params": full if strategy == "fsdp_no_reshard" else 0}
            row["model_states_fwd"] = row["params"] + row["optimizer"] + row["unsharded_params"]
        row["model_states"] = row["params"] + row["grads"] + row["optimizer"]
        out.append(row)
    return out


def flat_zero_bytes(n_params: int, stage: int, world: int, n_tensors: int = 1) -> list[dict[str, int]]:
    """Each rank's bytes after an Adam step of chapter 3's ``ShardedOptimizer`` (``zero_by_hand``).

    One flat fp32 buffer padded to ``N`` shards of ``s = ceil(Ψ/N)``: params ``4·N·s`` on every
    rank; gradients ``4·N·s`` under ZeRO-1 (the whole all-reduced sum is kept), ``4·s`` under
    ZeRO-2 (the reduce-scattered shard); Adam 8 bytes per element of the rank's real shard plus
    a 4-byte ``step`` for each of its ``n_tensors`` pieces (one per parameter tensor, empty
    ones included). With ``N`` dividing Ψ: :func:`ideal_bytes` + ``4·n_tensors``.
    """
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    size = -(-n_params // world)
    out = []
    for rank in range(world):
        real = max(0, min(size, n_params - rank * size))
        row = {"params": FP32 * size * world, "grads": FP32 * size * (world if stage == 1 else 1),
               "optimizer": 2 * FP32 * real + FP32 * n_tensors}
        row["model_states"] = sum(row.values())
        out.append(row)
    return out


def fsdp_peak_saving(n_params: int, unit_params: Sequence[int], world: int) -> int:
    """How many bytes FSDP by hand's peak must stay below ZeRO-2's, at least (fp32).

    ZeRO-2 holds the full parameters (``4Ψ``) all the time; FSDP by hand their shard (``4Ψ/N``)
    plus, at worst, the gathered root and the largest other unit (``unit_params``: the root's
    element count first). Activations and the sharded states are the same in both.
    """
    root, *others = unit_params
    return FP32 * n_params - FP32 * n_params // world - FP32 * (root + max(others, default=0))


def comm_bytes(shapes: Sequence[Shape], strategy: str, world: int,
               precision: str = "fp32") -> dict[str, int]:
    """Message bytes per collective type in one step (see :mod:`course_lib.sharding.comm_counter`).

    DDP all-reduces the fp32 gradients once (``4Ψ``); ZeRO-1 as torch builds it all-reduces them
    too (DDP does) and then each rank *broadcasts* the parameters it updated (``4Ψ`` in all).
    FSDP2 all-gathers the padded parameters (in bf16 under "amp") — once for ``"fsdp_no_reshard"``,
    twice for ``"fsdp"`` — and reduce-scatters the padded fp32 gradients. On one rank FSDP2 skips its
    collectives, while DDP and ZeRO-1 still make their calls (which then copy nothing anywhere).
    """
    strategy = canonical_strategy(strategy)
    total = sum(_numel(s) for s in shapes)
    if strategy == "ddp":
        return {"all_reduce": FP32 * total}
    if strategy == "zero1":
        return {"all_reduce": FP32 * total, "broadcast": FP32 * total}
    if world == 1:
        return {}
    padded = sum(fsdp_rows(s[0] if s else 1, world)[0] * _numel(s[1:]) for s in shapes) * world
    gathers = 2 if strategy == "fsdp" else 1
    return {"all_gather": gathers * (BF16 if precision in ("amp", "mixed") else FP32) * padded,
            "reduce_scatter": FP32 * padded}


def paper_comm(n_params: float, strategy: str) -> float:
    """The paper's per-step volume in elements: 2Ψ for DP, ZeRO-1 and ZeRO-2; 3Ψ for ZeRO-3."""
    return (3 if strategy == "fsdp" else 2) * n_params


#: How the strategies of this chapter are spelled in the frameworks people use. Megatron-LM:
#: ``--use-distributed-optimizer`` shards optimizer states and fp32 main params and
#: reduce-scatters gradients into a full-size gradient buffer (ZeRO-1 memory, ZeRO-2 traffic);
#: Megatron-FSDP picks the stage with ``--data-parallel-sharding-strategy``.
NAMES_IN_THE_WILD: list[dict[str, str]] = [
    {"course": "ddp", "ZeRO": "stage 0 (plain DP)",
     "DeepSpeed": '"zero_optimization": {"stage": 0}',
     "FSDP1": "ShardingStrategy.NO_SHARD", "FSDP2": "(DDP; fully_shard has no replicate-all mode)",
     "Megatron-LM": "default: DDP (under --use-megatron-fsdp: --data-parallel-sharding-strategy "
                    "no_shard; that flag's default is optim_grads_params)"},
    {"course": "zero1", "ZeRO": "stage 1: P_os",
     "DeepSpeed": '"zero_optimization": {"stage": 1}',
     "FSDP1": "(none)", "FSDP2": "(none; torch has ZeroRedundancyOptimizer)",
     "Megatron-LM": "--use-distributed-optimizer (or --use-megatron-fsdp "
                    "--data-parallel-sharding-strategy optim)"},
    {"course": "fsdp_no_reshard", "ZeRO": "closest: stage 2, P_os+g (full parameters kept)",
     "DeepSpeed": '"zero_optimization": {"stage": 2}',
     "FSDP1": "ShardingStrategy.SHARD_GRAD_OP", "FSDP2": "fully_shard(..., reshard_after_forward=False)",
     "Megatron-LM": "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads; "
                    "--use-torch-fsdp2 --torch-fsdp2-no-reshard-after-forward"},
    {"course": "fsdp", "ZeRO": "stage 3: P_os+g+p",
     "DeepSpeed": '"zero_optimization": {"stage": 3}',
     "FSDP1": "ShardingStrategy.FULL_SHARD", "FSDP2": "fully_shard(..., reshard_after_forward=True)",
     "Megatron-LM": "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params; "
                    "--use-torch-fsdp2"},
]
