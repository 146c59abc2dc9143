"""DDP communication hooks (chapter 11): what each one puts on the wire, predicted.

A comm hook replaces the all-reduce of each gradient bucket. torch ships them in
``torch.distributed.algorithms.ddp_comm_hooks``: fp16/bf16 compression (cast, all-reduce,
cast back: half the bytes) and PowerSGD (Vogels et al., NeurIPS 2019: each gradient matrix
M (n x m) is all-reduced as two thin factors P (n x r) and Q (m x r); tensors too small to
gain, such as biases, go uncompressed; the error left out is fed back into the next step).
On CPU/gloo DDP refuses ``bf16_compress_hook`` by its name (it asks for CUDA and NCCL 2.10+);
the same compression through torch's ``_compress_hook(torch.bfloat16, ...)`` runs on gloo.
"""
from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

HOOKS = ("allreduce", "fp16", "bf16", "powersgd_r1", "powersgd_r4")
START_POWERSGD = 2   # PowerSGD runs plain all-reduces for its first steps (torch requires > 1)


def validate_hook(name: object) -> str:
    """The hook's name, or a ValueError naming the known ones (before any process starts)."""
    if name not in HOOKS:
        raise ValueError(f"unknown hook {name!r}; choose one of {', '.join(HOOKS)}")
    return name


def powersgd_rank(name: str) -> int:
    """The matrix approximation rank r in ``powersgd_r<r>``; 0 for the other hooks."""
    return int(name.rpartition("_r")[2]) if name.startswith("powersgd") else 0


def bf16_hook(process_group, bucket):
    """``bf16_compress_hook``'s work under another name: DDP checks the name, not the backend."""
    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def register(model, name: str) -> None:
    """Register hook ``name`` on the DDP ``model`` (``allreduce``: DDP's own, nothing to do)."""
    validate_hook(name)
    if name == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":  # by another name than bf16_compress_hook, which DDP refuses on CPU
        model.register_comm_hook(None, bf16_hook)
    elif name.startswith("powersgd"):
        state = powerSGD_hook.PowerSGDState(process_group=None,
                                            matrix_approximation_rank=powersgd_rank(name),
                                            start_powerSGD_iter=START_POWERSGD, random_seed=0)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def _allreduced(shape, r: int, min_rate: float = 2.0) -> int:
    """Elements PowerSGD at rank ``r`` all-reduces for a gradient of ``shape``: P and Q, or the
    whole tensor where torch's ``_should_compress`` keeps it (a matrix ``shape[0] x rest`` must
    shrink ``min_compression_rate`` = 2 times; a 1-D tensor never does)."""
    numel = torch.Size(shape).numel()
    if len(shape) < 2:
        return numel
    rows, cols = shape[0], numel // shape[0]
    small = (rows + cols) * min(r, rows, cols)
    return small if small * min_rate < numel else numel


def _powersgd_elements(shapes, r: int) -> int:
    """Elements one step of PowerSGD at rank ``r`` all-reduces for gradients of ``shapes``."""
    return sum(_allreduced(shape, r) for shape in shapes)


def predicted_payload(shapes, name: str) -> int:
    """Bytes one step's all-reduces carry (summed over buckets) for gradients of ``shapes``."""
    validate_hook(name)
    numel = sum(torch.Size(s).numel() for s in shapes)
    if name in ("fp16", "bf16"):
        return 2 * numel
    r = powersgd_rank(name)
    if not r:
        return 4 * numel
    return 4 * _powersgd_elements(shapes, r)


def resnet18_cifar_shapes(classes: int = 10) -> list[torch.Size]:
    """Parameter shapes of ResNet-18 for 32×32 images (He et al. 2016; the CIFAR variant PowerSGD's
    paper trains): a 3×3 stem, four stages of two basic blocks (64-512 channels), a 1×1
    projection where a block changes shape, batch norms, a linear head. No tensor is allocated."""
    def conv_bn(c_out, c_in, k):
        return [torch.Size([c_out, c_in, k, k]), torch.Size([c_out]), torch.Size([c_out])]
    shapes, c_in = conv_bn(64, 3, 3), 64
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            shapes += conv_bn(width, c_in, 3) + conv_bn(width, width, 3)
            if block == 0 and (stage > 0 or c_in != width):
                shapes += conv_bn(width, c_in, 1)
            c_in = width
    return shapes + [torch.Size([classes, 512]), torch.Size([classes])]


def powersgd_ratio(shapes, r: int) -> float:
    """How many times fewer numbers PowerSGD at rank ``r`` all-reduces than the plain
    all-reduce for gradients of ``shapes`` (torch's rule: 1-D tensors, and matrices that would
    not shrink twice, go whole)."""
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ValueError(f"the rank r must be an int >= 1, got {r!r}")
    sizes = [torch.Size(s) for s in shapes]
    return sum(s.numel() for s in sizes) / _powersgd_elements(sizes, r)
