"""Run a tensor-parallel block on ``t`` ranks and hold it against the dense one (chapter 4).

:func:`tp_block_rank` is what each rank runs (shipped by reference through
:func:`course_lib.run`): it builds the dense :class:`~course_lib.common.models.Block` from a seed,
runs forward + backward densely (the reference), then the hand-written :class:`TPBlock` or the
DTensor version, and returns this rank's output, input gradient, its gradient shards beside the
matching slices of the dense gradients, its parameter bytes and the bytes it all-reduced,
counted from outside by :class:`~course_lib.sharding.comm_counter.CommCounter` (the same counter
for the hand-written, DTensor and Megatron-core blocks; the blocks carry no instrument).
:func:`measure_tp` validates the request before any process starts and collects the ranks.
:func:`dense_block_run` and :func:`tp_report` are the shared reference machinery: the
Megatron-core block of :mod:`course_lib.tensor_parallel.megatron` is held against the same dense run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_lib.common.checks import positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import Block, GPT, GPTConfig, get_config
from course_lib.launcher.launch import run
from course_lib.sharding.comm_counter import CommCounter
from course_lib.tensor_parallel.layers import (TPBlock, validate_tp_degree, dtensor_block,
                                               expected_block_bytes, param_bytes, qkv_rows,
                                               tp_gpt)

__all__ = ["TPReport", "DenseBlockRun", "dense_block_run", "counted_step", "tp_report",
           "hand_or_dtensor_report",
           "tp_block_rank", "measure_tp", "TP_CONFIG", "TPModelReport", "tp_gpt_rank",
           "measure_tp_model"]

#: The default block for chapter 4's tensor-parallel runs (4 heads: t = 1, 2, 4 all divide).
TP_CONFIG = GPTConfig(n_layer=1, n_head=4, d_model=64, seq_len=32)
_IMPLS = ("hand", "dtensor")


@dataclass
class TPReport:
    """One rank's result (tensors are small; they travel back to the parent for the tests)."""

    rank: int
    t: int
    impl: str
    output: torch.Tensor
    dense_output: torch.Tensor
    input_grad: torch.Tensor
    dense_input_grad: torch.Tensor
    grads: dict          # name -> (this rank's gradient shard, the matching dense slice)
    param_bytes: dict    # {"split": ..., "replicated": ...} on this rank
    dense_param_bytes: int
    comm_bytes: dict     # {"forward": bytes, "backward": bytes} handed to collectives (CommCounter)
    comm_calls: dict     # {"forward": n, "backward": n} collectives
    expected: dict       # expected_block_bytes(...)

    def matches_dense(self) -> bool:
        """Output, input gradient and every weight-gradient shard equal the dense block's (fp32
        sums re-added across ranks: ~5e-7 on outputs, ~3e-9 on gradients)."""
        close = torch.testing.assert_close
        close(self.output, self.dense_output, rtol=1e-5, atol=1e-6)
        close(self.input_grad, self.dense_input_grad, rtol=1e-4, atol=1e-7)
        for shard, dense_slice in self.grads.values():
            close(shard, dense_slice, rtol=1e-4, atol=1e-7)
        return True


def _dense_slices(dense: Block, config: GPTConfig, rank: int, t: int) -> dict[str, torch.Tensor]:
    """The slices of the dense gradients that rank ``rank`` should hold (Megatron split)."""
    h = config.d_model
    rows, width, per = qkv_rows(config, rank, t), 4 * h // t, h // t
    g = {n: p.grad for n, p in dense.named_parameters()}
    return {"attn.qkv.weight": g["attn.qkv.weight"][rows], "attn.qkv.bias": g["attn.qkv.bias"][rows],
            "attn.proj.weight": g["attn.proj.weight"][:, rank * per:(rank + 1) * per],
            "attn.proj.bias": g["attn.proj.bias"],
            "mlp.fc.weight": g["mlp.fc.weight"][rank * width:(rank + 1) * width],
            "mlp.fc.bias": g["mlp.fc.bias"][rank * width:(rank + 1) * width],
            "mlp.proj.weight": g["mlp.proj.weight"][:, rank * width:(rank + 1) * width],
            "mlp.proj.bias": g["mlp.proj.bias"], "ln1.weight": g["ln1.weight"],
            "ln2.weight": g["ln2.weight"]}


@dataclass
class DenseBlockRun:
    """The reference every implementation is held against: the dense block, its input and
    target, and its output and input gradient after ``((out - target)**2).mean().backward()``."""

    config: GPTConfig
    dense: Block
    x: torch.Tensor
    target: torch.Tensor
    output: torch.Tensor
    input_grad: torch.Tensor


def dense_block_run(config: GPTConfig, batch: int = 2, seed: int = 0) -> DenseBlockRun:
    """Build the dense block from ``seed`` and run forward + backward (same on every rank)."""
    torch.manual_seed(seed)
    dense = Block(config)
    x = torch.randn(batch, config.seq_len, config.d_model, generator=torch.Generator().manual_seed(seed + 1))
    target = torch.randn_like(x)
    xd = x.clone().requires_grad_()
    out_d = dense(xd)
    ((out_d - target) ** 2).mean().backward()
    return DenseBlockRun(config, dense, x, target, out_d.detach(), xd.grad.clone())


def counted_step(forward, backward) -> tuple[object, dict, dict]:
    """Run ``forward()`` then ``backward(its output)`` under one :class:`CommCounter`:
    ``(output, bytes, calls)``, the last two split ``{"forward": ..., "backward": ...}``."""
    phases = {}
    with CommCounter() as counter:
        out = forward()
        out = out.wait() if hasattr(out, "wait") else out   # an AsyncCollectiveTensor
        phases["forward"] = list(counter.calls)
        counter.reset()
        backward(out)
        phases["backward"] = list(counter.calls)
    return (out, {p: sum(size for _, size, _ in c) for p, c in phases.items()},
            {p: len(c) for p, c in phases.items()})


def tp_report(ref: DenseBlockRun, impl: str, block: torch.nn.Module,
              names: dict | None = None) -> TPReport:
    """Run ``block`` forward + the same loss's backward on this rank and compare with ``ref``;
    its collectives are counted from outside (:func:`counted_step`). ``names`` renames
    parameters to the dense block's."""
    rank, t = dist.get_rank(), dist.get_world_size()
    xt = ref.x.clone().requires_grad_()
    out, comm_bytes, comm_calls = counted_step(
        lambda: block(xt), lambda out: ((out - ref.target) ** 2).mean().backward())
    names = names or {}
    local = {names.get(n, n): p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
             for n, p in block.named_parameters()}  # a DTensor gradient: this rank's shard
    expected = _dense_slices(ref.dense, ref.config, rank, t)
    grads = {n: (local[n].detach().clone(), expected[n].clone()) for n in expected}
    batch, seq, h = ref.x.shape
    return TPReport(rank, t, impl, out.detach().clone(), ref.output, xt.grad.clone(), ref.input_grad,
                    grads, param_bytes(block),
                    sum(p.numel() * p.element_size() for p in ref.dense.parameters()),
                    comm_bytes, comm_calls, expected_block_bytes(batch, seq, h))


def tp_block_rank(config: GPTConfig, impl: str = "hand", batch: int = 2, seed: int = 0) -> TPReport:
    """Run on every rank: dense reference, then the ``impl`` tensor-parallel block; compare."""
    return hand_or_dtensor_report(dense_block_run(config, batch, seed), impl)


def hand_or_dtensor_report(ref: DenseBlockRun, impl: str) -> TPReport:
    """This rank's :class:`TPReport` for the hand-written (``"hand"``) or DTensor block."""
    rank, t = dist.get_rank(), dist.get_world_size()
    if impl == "hand":
        block = TPBlock(ref.dense, ref.config, rank, t)
        names = {"attn.proj_bias": "attn.proj.bias", "mlp.proj_bias": "mlp.proj.bias"}
        return tp_report(ref, impl, block, names)
    from torch.distributed.device_mesh import init_device_mesh
    block = dtensor_block(ref.dense, ref.config, init_device_mesh("cpu", (t,)))
    return tp_report(ref, impl, block)


def measure_tp(t: int = 2, impl: str = "hand", config: GPTConfig | str = TP_CONFIG, batch: int = 2,
               seed: int = 0, timeout: float = 120.0) -> list[TPReport]:
    """Run :func:`tp_block_rank` on ``t`` ranks; bad requests fail before any process starts."""
    config = get_config(config)
    validate_tp_degree(config, t)
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    positive_int(batch, "batch")
    return run(tp_block_rank, t, config, impl, batch, seed, timeout=timeout, threads=1)


@dataclass
class TPModelReport:
    """One rank's view of a whole tensor-parallel GPT: loss, bytes held, bytes all-reduced."""

    rank: int
    t: int
    loss: float
    dense_loss: float
    max_logit_error: float
    param_bytes: dict    # {"split": ..., "replicated": ...}
    dense_param_bytes: int
    comm_bytes: dict     # measured per step, all layers
    comm_calls: dict
    expected: dict       # per step, all layers: n_layer x expected_block_bytes


def tp_gpt_rank(config: GPTConfig, batch: int = 2, seed: int = 0) -> TPModelReport:
    """Run on every rank: one forward+backward of the dense GPT and of :func:`tp_gpt`."""
    rank, t = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    dense = GPT(config)
    idx, targets = get_batch(batch, config.seq_len, seed=seed)
    model = tp_gpt(dense, rank, t)
    dense_logits = dense(idx)
    logits, comm_bytes, comm_calls = counted_step(
        lambda: model(idx), lambda logits: GPT.loss(logits, targets).backward())
    per_block = expected_block_bytes(batch, config.seq_len, config.d_model)
    return TPModelReport(rank, t, GPT.loss(logits.detach(), targets).item(),
                         GPT.loss(dense_logits, targets).item(),
                         (logits - dense_logits).abs().max().item(), param_bytes(model),
                         sum(p.numel() * p.element_size() for p in dense.parameters()),
                         comm_bytes, comm_calls,
                         {p: config.n_layer * per_block[p] for p in ("forward", "backward")})


def measure_tp_model(t: int = 2, config: GPTConfig | str = "small", batch: int = 2, seed: int = 0,
                     timeout: float = 120.0) -> list[TPModelReport]:
    """Run :func:`tp_gpt_rank` on ``t`` ranks; bad requests fail before any process starts."""
    config = get_config(config)
    validate_tp_degree(config, t)
    positive_int(batch, "batch")
    return run(tp_gpt_rank, t, config, batch, seed, timeout=timeout, threads=1)
