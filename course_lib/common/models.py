"""The course's model family: a small GPT-style decoder and a plain MLP.

Chapter 1 measures where their training memory goes; later chapters shard them: FSDP2 wraps each
entry of ``GPT.blocks`` (chapter 3), pipeline parallelism splits ``blocks`` into stages, tensor
parallelism splits the column-parallel ``attn.qkv``/``mlp.fc`` and the row-parallel
``attn.proj``/``mlp.proj``. Kept plain so that :mod:`course_lib.memory.predict` can derive their
memory: pre-LayerNorm blocks, a GELU MLP of width ``4 * d_model``, learned position embeddings,
no dropout, untied embeddings by default (FSDP2 cannot wrap a tied ``lm_head`` block by block).
``attention="sdpa"`` (default) keeps activations linear in the sequence length;
``"explicit"`` stores the ``b·a·s²`` attention matrix. :meth:`GPT.set_recompute` turns on
activation recomputation: ``"full"`` around every block, ``"selective"`` around the attention
core (:meth:`Attention.core`); off by default and under ``no_grad``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from course_lib.common.checks import is_int, positive_int

__all__ = ["GPTConfig", "GPT", "MLP", "PRESETS", "get_config", "param_count", "mlp_param_count",
           "RECOMPUTE", "qkv_rows", "Stage"]

_ATTENTION = ("sdpa", "explicit")
#: Activation recomputation modes of :meth:`GPT.set_recompute`.
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`GPT`. Validated on creation so a bad size fails before allocating."""

    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int = 256
    seq_len: int = 128
    bias: bool = True
    tie_weights: bool = False
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_model", "vocab_size", "seq_len"):
            positive_int(getattr(self, name), f"GPTConfig.{name}")
        if self.d_model % self.n_head:
            raise ValueError(f"n_head={self.n_head} must divide d_model={self.d_model} "
                             f"(each head gets d_model / n_head channels)")
        if self.attention not in _ATTENTION:
            raise ValueError(f"attention must be one of {_ATTENTION}, got {self.attention!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def replace(self, **changes: object) -> "GPTConfig":
        """A copy with some fields changed (validated again)."""
        return GPTConfig(**{**asdict(self), **changes})


#: Named sizes. The first three run interactively on 2 CPU cores; ``gpt-7b`` (the shape of
#: GPT-3 6.7B with a 50304-token vocabulary) is only meant for fake-tensor estimates.
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=2, n_head=2, d_model=64, vocab_size=256, seq_len=64),
    "small": GPTConfig(n_layer=4, n_head=4, d_model=128, vocab_size=256, seq_len=128),
    "medium": GPTConfig(n_layer=6, n_head=8, d_model=256, vocab_size=256, seq_len=256),
    "gpt-7b": GPTConfig(n_layer=32, n_head=32, d_model=4096, vocab_size=50304, seq_len=2048),
}


def get_config(name: str | GPTConfig) -> GPTConfig:
    """Look up a preset by name (a :class:`GPTConfig` passes through)."""
    if isinstance(name, GPTConfig):
        return name
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def param_count(config: GPTConfig) -> int:
    """Number of parameters of ``GPT(config)``, from the sizes alone (no model is built).

    Per block: 2 LayerNorms (2h each) + qkv (3h² + 3h) + attn proj (h² + h) + fc (4h² + 4h)
    + mlp proj (4h² + h) = 12h² + 13h with biases (12h² + 2h without: LayerNorm keeps its weight).
    Plus token and position embeddings, the final LayerNorm and (untied) ``lm_head``.
    """
    h, b = config.d_model, int(config.bias)
    per_block = 12 * h * h + 2 * h + b * 11 * h
    embeddings = config.vocab_size * h + config.seq_len * h
    head = h + b * h + (0 if config.tie_weights else config.vocab_size * h)
    return config.n_layer * per_block + embeddings + head


class Attention(nn.Module):
    """Causal multi-head self-attention: ``qkv`` (column-parallel) then ``proj`` (row-parallel)."""

    def __init__(self, config: GPTConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.head_dim, self.explicit = config.head_dim, config.attention == "explicit"
        self.recompute_core = False  # set by GPT.set_recompute("selective")
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias, dtype=dtype)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # (b, s, 3h) -> three views of shape (b, a, s, h/a); no copies are made. The head count is
        # inferred (-1) so that a tensor-parallel rank holding a slice of the heads runs unchanged.
        q, k, v = self.qkv(x).view(b, s, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.recompute_core and torch.is_grad_enabled():  # selective: keep q, k, v, not scores
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(QKᵀ/√d)V with a causal mask: the part selective recomputation recomputes."""
        if self.explicit:
            s = q.size(-2)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
            causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
            att = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            return att @ v
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class FeedForward(nn.Module):
    """The block's MLP: ``fc`` (h -> 4h, column-parallel), GELU, ``proj`` (4h -> h, row-parallel)."""

    def __init__(self, config: GPTConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model, bias=config.bias, dtype=dtype)
        self.proj = nn.Linear(4 * config.d_model, config.d_model, bias=config.bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """One pre-LN transformer block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    def __init__(self, config: GPTConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model, bias=config.bias, dtype=dtype)
        self.attn = Attention(config, dtype)
        self.ln2 = nn.LayerNorm(config.d_model, bias=config.bias, dtype=dtype)
        self.mlp = FeedForward(config, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-style decoder: ``tok_emb + pos_emb -> blocks -> ln_f -> lm_head`` (logits).

    ``forward(idx)`` takes token ids of shape ``(batch, seq)`` and returns logits of shape
    ``(batch, seq, vocab_size)``; :meth:`loss` is the next-token cross-entropy, computed in fp32.
    Weights are initialised from ``torch``'s global generator: seed it for reproducible runs.
    ``dtype`` builds the weights directly in that dtype (e.g. ``torch.bfloat16``): unlike
    ``.to(dtype)`` afterwards this also works under ``FakeTensorMode``.
    """

    def __init__(self, config: GPTConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model, dtype=dtype)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model, dtype=dtype)
        self.blocks = nn.ModuleList(Block(config, dtype) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias, dtype=dtype)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False, dtype=dtype)
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.recompute = "none"

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq = idx.size(1)
        if seq > self.config.seq_len:
            raise ValueError(f"sequence length {seq} exceeds config.seq_len={self.config.seq_len}")
        pos = torch.arange(seq, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        full = self.recompute == "full" and torch.is_grad_enabled()
        for block in self.blocks:  # full: keep each block's input, recompute its inside in backward
            x = checkpoint(block, x, use_reentrant=False) if full else block(x)
        return self.lm_head(self.ln_f(x))

    def set_recompute(self, mode: str = "none") -> "GPT":
        """Activation recomputation: ``"none"``, ``"full"`` (``torch.utils.checkpoint`` around
        every block) or ``"selective"`` (around the attention core only, Korthikanti et al.)."""
        if mode not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {mode!r}")
        self.recompute = mode
        for block in self.blocks:
            block.attn.recompute_core = mode == "selective"
        return self

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy over all positions (logits flattened, upcast to fp32)."""
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def qkv_rows(config: GPTConfig, rank: int, t: int) -> torch.Tensor:
    """Row indices of ``attn.qkv.weight`` that tensor-parallel rank ``rank`` of ``t`` keeps: q, k,
    v of its heads (chapter 4's split; here, beside the layout it reads, for ``scripts/tiny.py`` too).

    The dense layout is ``[q (h rows) | k (h) | v (h)]``, heads contiguous inside each. Rank r
    takes the rows of heads ``r·a/t … (r+1)·a/t`` from each of the three, in that order.
    """
    h, per = config.d_model, config.d_model // t
    return torch.cat([torch.arange(part * h + rank * per, part * h + (rank + 1) * per)
                      for part in range(3)])


class Stage(nn.Module):
    """Stage ``index`` of ``p``: blocks ``[index·n/p, (index+1)·n/p)`` of ``model`` (shared, not copied).

    This is the model-code change pipeline parallelism needs: ``GPT.forward`` runs embeddings,
    all blocks and the head in one process; a stage runs only its part, and what it gets and
    returns depends on where it sits (token ids in, logits out, or activations in between).
    Chapter 4 teaches it; it lives beside the GPT so that ``scripts/pipeline.py`` needs no chapter.
    """

    def __init__(self, model: GPT, index: int, p: int) -> None:
        super().__init__()
        per = model.config.n_layer // p
        self.first, self.last, self.offset = index == 0, index == p - 1, index * per
        self.blocks = nn.ModuleList(model.blocks[self.offset:self.offset + per])
        if self.first:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        if self.last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:                       # x: token ids (b, s)
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.size(1), device=x.device))
        for block in self.blocks:            # x: activations (b, s, h)
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x

    def global_name(self, name: str) -> str:
        """The name this parameter has in the unsplit :class:`GPT` (``blocks.j`` → ``blocks.offset+j``)."""
        if name.startswith("blocks."):
            _, j, rest = name.split(".", 2)
            return f"blocks.{self.offset + int(j)}.{rest}"
        return name


class MLP(nn.Sequential):
    """A plain multi-layer perceptron ``Linear -> ReLU -> ... -> Linear`` for the simplest demos.

    ``MLP([32, 64, 64, 1])`` has two hidden layers of width 64. Layers are named ``fc0``,
    ``fc1``, ... so strategies can address them.
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        sizes = list(sizes)
        if len(sizes) < 2 or any(not is_int(n) or n <= 0 for n in sizes):
            raise ValueError(f"MLP sizes must be at least two positive integers, got {sizes!r}")
        super().__init__()
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            if i:
                self.add_module(f"act{i - 1}", nn.ReLU())
            self.add_module(f"fc{i}", nn.Linear(n_in, n_out))


def mlp_param_count(sizes: Sequence[int]) -> int:
    """Parameters of ``MLP(sizes)``: a weight (in·out) and a bias (out) per layer."""
    return sum(n_in * n_out + n_out for n_in, n_out in zip(sizes[:-1], sizes[1:]))
