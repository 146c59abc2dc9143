"""Megatron-style tensor parallelism, by hand and with DTensor (chapter 4, ``04_model_parallel``).

One transformer block is split over the ``t`` ranks of a group: ``mlp.fc`` is
**column-parallel** (rank r keeps rows ``r·4h/t … (r+1)·4h/t`` and computes its slice of the
hidden layer; GELU stays local), ``mlp.proj`` **row-parallel** (the matching columns give a
*partial* sum; one all-reduce adds them, then the bias once); attention does the same with
**heads** (``attn.qkv`` keeps its ``a/t`` heads' q, k, v rows; ``attn.proj`` is row-parallel).
Two conjugate autograd functions carry all the communication (Megatron's f and g): ``f`` is
identity forward, all-reduce backward; ``g`` all-reduce forward, identity backward. Per block: 2
all-reduces of ``b·s·h`` elements in forward and 2 in backward. No instrument inside: the bytes
are counted by :class:`~course_lib.sharding.comm_counter.CommCounter` (in
:mod:`~course_lib.tensor_parallel.measure`). :func:`dtensor_block`: the same split in DTensor.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.common.checks import positive_int
from course_lib.common.deprecation import renamed
from course_lib.common.models import Block, GPT, GPTConfig, qkv_rows  # qkv_rows: re-exported

__all__ = ["copy_to_tp", "reduce_from_tp", "TPAttention", "TPMLP", "TPBlock", "tp_gpt",
           "tp_plan", "validate_tp_degree", "qkv_rows", "dtensor_block",
           "param_bytes", "expected_block_bytes"]


class _CopyToTP(torch.autograd.Function):
    """f: identity in forward; all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)  # each rank saw only its heads / its 4h/t slice
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce (sum of the partial outputs) in forward; identity in backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's f: enter a tensor-parallel region (identity forward, all-reduce backward)."""
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's g: leave a tensor-parallel region (all-reduce forward, identity backward)."""
    return _ReduceFromTP.apply(x, group)


def validate_tp_degree(config: GPTConfig, t: int) -> None:
    """Raise ``ValueError`` unless ``t`` ranks can split the heads (and so the MLP) evenly."""
    positive_int(t, "tensor-parallel degree")
    if config.n_head % t:
        raise ValueError(f"n_head={config.n_head} is not divisible by the tensor-parallel degree "
                         f"t={t}: every rank must own the same number of whole heads")


__getattr__ = renamed(__name__, {"check_tp_degree": "validate_tp_degree"})  # before issue 32


def _slice_linear(dense: nn.Linear, rows: torch.Tensor | None = None, cols: slice | None = None,
                  bias: bool = True) -> nn.Linear:
    """A new Linear holding ``dense.weight[rows][:, cols]`` (and the bias rows if ``bias``)."""
    w = dense.weight.detach()
    w = w[rows] if rows is not None else w
    w = w[:, cols] if cols is not None else w
    out = nn.Linear(w.shape[1], w.shape[0], bias=bias and dense.bias is not None, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w)
        if out.bias is not None:
            out.bias.copy_(dense.bias.detach()[rows] if rows is not None else dense.bias.detach())
    return out


class TPAttention(nn.Module):
    """Attention on ``a/t`` local heads: qkv column-parallel, proj row-parallel (bias after g)."""

    def __init__(self, dense, config: GPTConfig, rank: int, t: int, group=None) -> None:
        super().__init__()
        self.group, self.head_dim = group, config.head_dim
        per = config.d_model // t
        self.qkv = _slice_linear(dense.qkv, rows=qkv_rows(config, rank, t))
        self.proj = _slice_linear(dense.proj, cols=slice(rank * per, (rank + 1) * per), bias=False)
        self.proj_bias = None if dense.proj.bias is None else nn.Parameter(dense.proj.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to_tp(x, self.group)                                # f
        q, k, v = self.qkv(x).view(b, s, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # local heads only
        y = self.proj(y.transpose(1, 2).reshape(b, s, -1))           # partial sum over heads
        y = reduce_from_tp(y, self.group)                            # g
        return y if self.proj_bias is None else y + self.proj_bias


class TPMLP(nn.Module):
    """The MLP with ``fc`` column-parallel and ``proj`` row-parallel (bias after g)."""

    def __init__(self, dense, config: GPTConfig, rank: int, t: int, group=None) -> None:
        super().__init__()
        self.group = group
        width = 4 * config.d_model // t
        self.fc = _slice_linear(dense.fc, rows=torch.arange(rank * width, (rank + 1) * width))
        self.proj = _slice_linear(dense.proj, cols=slice(rank * width, (rank + 1) * width), bias=False)
        self.proj_bias = None if dense.proj.bias is None else nn.Parameter(dense.proj.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.group)                                # f
        y = self.proj(F.gelu(self.fc(x)))                            # partial sum over 4h/t
        y = reduce_from_tp(y, self.group)                            # g
        return y if self.proj_bias is None else y + self.proj_bias


class TPBlock(nn.Module):
    """A :class:`~course_lib.common.models.Block` split over ``t`` ranks; LayerNorms stay replicated."""

    def __init__(self, dense: Block, config: GPTConfig, rank: int, t: int, group=None) -> None:
        super().__init__()
        validate_tp_degree(config, t)
        if config.attention != "sdpa":
            raise ValueError("the tensor-parallel block implements attention='sdpa' only")
        self.ln1, self.ln2 = copy.deepcopy(dense.ln1), copy.deepcopy(dense.ln2)
        self.attn = TPAttention(dense.attn, config, rank, t, group)
        self.mlp = TPMLP(dense.mlp, config, rank, t, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # the same two lines as Block.forward
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def tp_gpt(dense: GPT, rank: int, t: int, group=None) -> GPT:
    """A copy of ``dense`` whose blocks are :class:`TPBlock`; embeddings and head replicated."""
    validate_tp_degree(dense.config, t)
    model = copy.deepcopy(dense)
    model.blocks = nn.ModuleList(TPBlock(b, dense.config, rank, t, group) for b in dense.blocks)
    return model


class _HeadShardedAttention(nn.Module):
    """Dense attention whose forward works on however many heads its qkv output holds.

    After ColwiseParallel the qkv output is rank-local, so the forward infers the head count
    (``view(b, s, 3, -1, head_dim)``, as :class:`course_lib.common.models.Attention` does); the
    change DTensor needs is the reordered ``qkv`` rows.
    """

    def __init__(self, dense, config: GPTConfig, t: int) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        order = torch.cat([qkv_rows(config, r, t) for r in range(t)])  # rank r's rows contiguous
        self.qkv = _slice_linear(dense.qkv, rows=order)
        self.proj = copy.deepcopy(dense.proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


def dtensor_block(dense: Block, config: GPTConfig, mesh) -> Block:
    """A copy of ``dense`` tensor-parallelised by ``parallelize_module`` on a 1-D ``mesh``.

    ``qkv`` rows are reordered first (see :func:`qkv_rows`) so ColwiseParallel's contiguous
    chunk r holds exactly rank r's heads; its output stays local (``use_local_output=True``),
    and RowwiseParallel's output is an all-reduced tensor (possibly an AsyncCollectiveTensor).
    """
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    t = mesh.size()
    validate_tp_degree(config, t)
    block = copy.deepcopy(dense)
    block.attn = _HeadShardedAttention(dense.attn, config, t)
    styles = {"column": ColwiseParallel, "row": RowwiseParallel}
    plan = {name: styles[style]() for name, style in tp_plan().items()}
    return parallelize_module(block, mesh, plan)


def tp_plan() -> dict[str, str]:
    """Megatron's split of a block, used by both versions: which linears are column/row-parallel."""
    return {"attn.qkv": "column", "attn.proj": "row", "mlp.fc": "column", "mlp.proj": "row"}


def param_bytes(module: nn.Module) -> dict[str, int]:
    """Bytes of this rank's parameters, split into ``split`` (sharded linears) and ``replicated``."""
    out = {"split": 0, "replicated": 0}
    for name, p in module.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        nbytes = local.numel() * local.element_size()
        kind = "split" if any(k in name for k in ("qkv.", "fc.", "proj.weight")) else "replicated"
        out[kind] += nbytes
    return out


def expected_block_bytes(batch: int, seq: int, d_model: int, element_size: int = 4) -> dict[str, int]:
    """The textbook traffic per block: 2 all-reduces of ``b·s·h`` elements each way."""
    one = batch * seq * d_model * element_size
    return {"forward": 2 * one, "backward": 2 * one, "all_reduces_per_pass": 2}
