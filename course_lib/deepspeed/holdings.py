"""Where a DeepSpeed rank's model-state bytes live — counted from its tensors, next to formulas.

Chapter 08 trains the course GPT with DeepSpeed ZeRO stages 0-3 and puts three answers side by
side per rank: **measured**, :func:`holdings` (the storages of the tensors the engine holds —
parameters and their ``ds_tensor`` partitions, the ZeRO optimizer's flat buffers, the torch
optimizer's states — each storage once, padding included); **predicted**,
:func:`predict_deepspeed` (from the shapes, with DeepSpeed's layout rules, in fp32 or bf16); and
**DeepSpeed's own estimate**, :func:`deepspeed_estimate` (its ZeRO-2 and ZeRO-3
``estimate_*_model_states_mem_needs``, which assume 16-bit mixed precision). Why not chapter 01's tracker, the layout
rules and what DeepSpeed's estimate leaves out: docs/modules/deepspeed.md (holdings.py).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from course_lib.common.dtypes import BF16, BOOL, FP32, FP64
from course_lib.common.models import GPTConfig, get_config
from course_lib.deepspeed.load import _import_deepspeed

__all__ = ["CATEGORIES", "holdings", "predict_deepspeed", "deepspeed_estimate", "largest_layer",
           "flat_alignment", "split_key_bias"]

#: Categories of :func:`holdings`, in the order tensors are claimed (a storage counts once).
CATEGORIES = ("params", "grads", "master", "optimizer", "buckets", "other")

# ZeRO optimizer attributes -> category (anything else found on the engine goes to "other")
_ATTRS = {
    "params": ("bit16_groups_flat", "parallel_partitioned_bit16_groups", "bit16_groups",
               "fp16_partitioned_groups_flat", "fp16_groups"),
    "master": ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat",
               "fp32_groups"),  # the last: stage 0 in bf16/fp16 (FP16_UnfusedOptimizer)
    "grads": ("averaged_gradients", "all_grad_tensors", "grads_in_partition",
              "grad_partitions_flat_buffer",
              "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"),
    "buckets": ("ipg_buckets",),
}
_SKIP = ("module", "optimizer", "basic_optimizer", "client_optimizer")


def _tensors(obj: Any, depth: int, seen: set) -> list[torch.Tensor]:
    """Tensors reachable from ``obj`` through containers and DeepSpeed-defined objects."""
    if depth < 0 or id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        found = [obj]
        for extra in (obj.grad if obj.is_leaf else None,
                      getattr(obj, "ds_tensor", None)):
            if isinstance(extra, torch.Tensor):
                found += _tensors(extra, depth - 1, seen)
        return found
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif type(obj).__module__.startswith("deepspeed") and hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [t for item in items for t in _tensors(item, depth - 1, seen)]


def holdings(engine: Any) -> dict[str, int]:
    """Bytes of each category held by a DeepSpeed engine right now, from its actual tensors.

    Storages are claimed in this order, each counted once: the module's parameters, their
    ``ds_tensor`` partitions (ZeRO-3) → ``params``; their ``.grad`` → ``grads``; the wrapped
    torch optimizer's ``state`` → ``optimizer``; the ZeRO optimizer's flat buffers by attribute
    name (see ``_ATTRS``: fp32 master partitions → ``master``, flat gradient partitions and
    reduction buckets → ``grads``); every other tensor reachable from the engine → ``other``
    (e.g. the grad-norm scalar). Returns those keys plus ``model_states`` (their sum).
    Activations are not model states and are not walked.
    """
    claimed: dict[int, tuple[str, int]] = {}  # storage address -> (category, bytes)

    def claim(tensors: Sequence[torch.Tensor], category: str) -> None:
        for t in tensors:
            storage = t.untyped_storage()
            if t.device.type != "meta" and storage.nbytes() and storage.data_ptr() not in claimed:
                claimed[storage.data_ptr()] = (category, storage.nbytes())

    params = list(engine.module.parameters())
    claim(params, "params")
    claim([p.ds_tensor for p in params if getattr(p, "ds_tensor", None) is not None], "params")
    claim([p.grad for p in params if p.grad is not None], "grads")
    zero = engine.optimizer
    basic = getattr(zero, "optimizer", zero)
    claim(_tensors(dict(basic.state), 4, set()), "optimizer")
    for category, names in _ATTRS.items():
        for name in names:
            if zero is not None and hasattr(zero, name):
                holders = getattr(zero, name)
                claim(_tensors(holders, 5, set()), category)
                if category == "master":  # the fp32 partitions' .grad are gradients
                    grads = [t.grad for t in _tensors(holders, 3, set()) if t.grad is not None]
                    claim(grads, "grads")
    rest = {k: v for k, v in vars(zero).items() if k not in _SKIP} if zero is not None else {}
    claim(_tensors(rest, 5, set()), "other")
    claim(_tensors({k: v for k, v in vars(engine).items() if k not in _SKIP}, 3, set()), "other")
    out = {category: 0 for category in CATEGORIES}
    for category, nbytes in claimed.values():
        out[category] += nbytes
    out["model_states"] = sum(out[c] for c in CATEGORIES)
    return out


def flat_alignment(world: int) -> int:
    """DeepSpeed ZeRO-1/2 pads its flat buffer to a multiple of ``2·N`` elements.

    (``nccl_start_alignment_factor = 2`` — 4 bytes of fp16 — times the data-parallel size, in
    ``deepspeed/runtime/zero/stage_1_and_2.py``; it keeps every rank's partition equal.)
    """
    return 2 * world


def _partition_params(numels: Sequence[int], rank: int, part: int) -> int:
    """Elements of the *whole* tensors that overlap ``rank``'s slice of the flat buffer."""
    lo, hi, offset, total = rank * part, (rank + 1) * part, 0, 0
    for n in numels:
        if offset < hi and offset + n > lo:
            total += n
        offset += n
    return total


def predict_deepspeed(shapes: Sequence[tuple[int, ...]], stage: int, world: int, *,
                      rank: int = 0, moment: str = "step", bucket_elements: int = 2**14,
                      precision: str = "fp32") -> dict[str, int]:
    """The course's prediction of :func:`holdings` for Adam (``torch_adam``), per rank.

    ``moment="step"``: after ``engine.step()``; ``"backward"``: after ``engine.backward`` of a
    later step (the reduced gradients exist, Adam's states already do); ``"accumulate"``: after
    a backward that is *not* the last of its ``gradient_accumulation_steps`` (no step follows).
    ``bucket_elements`` is the config's ``reduce_bucket_size``. ``precision``: ``"fp32"`` (no
    ``bf16`` section) or ``"bf16"`` (``"bf16": {"enabled": true}``): the weights, gradients and
    buckets take ``w`` = 4 or 2 bytes per element; master weights and Adam's moments are fp32
    either way. Layout, read from DeepSpeed 0.19's source and checked against :func:`holdings`
    by the tests:

    * stage 0: the module's params ``wΨ``; grads ``wΨ`` after backward, freed by the step;
      Adam ``8Ψ`` + a 4-byte ``step`` per tensor; in bf16 also an fp32 master copy of every
      tensor, ``4Ψ`` (``FP16_UnfusedOptimizer``; its fp32 gradients exist only inside ``step``);
    * stages 1 and 2: params are views into one flat buffer of ``A`` elements (``Ψ`` padded to a
      multiple of ``2N``): ``wA``; a fp32 **master** copy of this rank's partition ``4A/N``
      (cloned even when training in fp32); Adam ``8A/N + 4`` (one flat tensor, one ``step``);
      after backward a gradient buffer holding the *whole* tensors that overlap the partition
      (so a little more than ``wA/N``; the last rank's includes the padding), freed by the
      step; the grad-norm scalar (4 B). The reduction buckets (``reduce_bucket_size``
      elements) live only *inside* backward — except while stage 1 accumulates: it keeps the
      full gradients ``wΨ`` (reduced only at the last micro-batch) and a bucket;
    * stage 3: every tensor is cut into ``ceil(numel/N)`` elements per rank, ``S`` in all:
      params ``wS`` (the ``ds_tensor`` partitions; the module's tensors are empty between
      steps), master ``4S``, the flat gradient buffer ``wS`` (kept allocated), Adam ``8S + 4``,
      one reduction bucket of ``reduce_bucket_size`` elements allocated at initialisation, an
      fp64 grad-norm scalar and a 1-byte inf/nan flag.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    if moment not in ("step", "backward", "accumulate"):
        raise ValueError(f"moment must be 'step', 'backward' or 'accumulate', got {moment!r}")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    w = FP32 if precision == "fp32" else BF16
    numels = [math.prod(s) for s in shapes]
    total = sum(numels)
    backward = moment != "step"
    if stage == 0:
        out = {"params": w * total, "grads": w * total if backward else 0,
               "master": 0 if precision == "fp32" else FP32 * total,
               "optimizer": 2 * FP32 * total + FP32 * len(shapes), "buckets": 0, "other": 0}
    elif stage in (1, 2):
        align = flat_alignment(world)
        part = -(-total // align) * align // world
        padded = numels + [part * world - total]  # the padding is a tensor of its own at the end
        grads = w * _partition_params(padded, rank, part) if backward else 0
        out = {"params": w * part * world, "grads": grads, "master": FP32 * part,
               "optimizer": 2 * FP32 * part + FP32, "buckets": 0, "other": FP32}
        if stage == 1 and moment == "accumulate":
            out.update(grads=w * total, buckets=w * bucket_elements)
    else:
        part = sum(-(-n // world) for n in numels)
        out = {"params": w * part, "grads": w * part, "master": FP32 * part,
               "optimizer": 2 * FP32 * part + FP32, "buckets": w * bucket_elements,
               "other": FP64 + BOOL}  # the grad norm, the inf/nan flag
    out["model_states"] = sum(out[c] for c in CATEGORIES)
    return out


def largest_layer(model: nn.Module) -> int:
    """Parameters of the largest module's own tensors (DeepSpeed's ``largest_layer_params``)."""
    return max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
               default=0)


def deepspeed_estimate(total_params: int, largest_layer_params: int, stage: int,
                       world: int, offload: str = "none") -> int | None:
    """DeepSpeed's per-GPU model-state estimate, from its own functions.

    Stage 2 (also used for stage 1, for which DeepSpeed has no estimator):
    ``2Ψ + 18Ψ/N``; stage 3: ``4·largest + 18Ψ/N``. ``None`` for stage 0.
    ``offload`` is the config's ``offload_optimizer``/``offload_param`` choice:
    ``"optimizer"`` (stages 1-3: the fp32 master weights, gradients and Adam states live in CPU
    memory; stage 2 → ``2Ψ``, stage 3 → ``4·largest + 2Ψ/N``) or ``"optimizer+params"``
    (stage 3 only: the 16-bit parameters too → ``4·largest``).
    """
    if offload not in ("none", "optimizer", "optimizer+params"):
        raise ValueError(f"offload must be 'none', 'optimizer' or 'optimizer+params', got {offload!r}")
    if offload == "optimizer+params" and stage != 3:
        raise ValueError("DeepSpeed offloads parameters (offload_param) only in ZeRO stage 3")
    if stage == 0:
        return None
    _import_deepspeed()  # quietly, with the CPU accelerator on a CPU machine
    if stage in (1, 2):
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
        _, gpu = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=world,
                                                       num_nodes=1, cpu_offload=offload != "none")
        return int(gpu)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    _, gpu, _ = estimate_zero3_model_states_mem_needs(total_params, largest_layer_params,
                                                      num_gpus_per_node=world, num_nodes=1,
                                                      cpu_offload=offload != "none",
                                                      cpu_offload_params=offload == "optimizer+params")
    return int(gpu)


def split_key_bias(params: dict[str, torch.Tensor], config: GPTConfig | str = "tiny"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(every parameter but the attention key biases, the key biases), each flattened.

    The key bias (``attn.qkv.bias[d:2d]``) gets an exactly-zero gradient in exact arithmetic —
    softmax ignores a constant added to a row of scores — so what reaches Adam is rounding noise
    that Adam turns into updates of up to ~lr per step, different for every summation order.
    Comparing DeepSpeed with DDP therefore needs two tolerances: one for these, one for the rest.
    """
    d = get_config(config).d_model if isinstance(config, str) else config.d_model
    rest, keys = [], []
    for name, value in params.items():
        if name.endswith("attn.qkv.bias"):
            keys.append(value[d:2 * d])
            rest += [value[:d], value[2 * d:]]
        else:
            rest.append(value.flatten())
    return torch.cat(rest), torch.cat(keys)
