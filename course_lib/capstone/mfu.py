"""MFU as torchtitan computes it, for the course's run and for a published one.

torchtitan (``get_dense_model_nparams_and_flops``, ``torchtitan/models/utils.py``) counts the
FLOPs of one trained token as ``6 · (parameters − embedding parameters) + 12 · l · h · q · t``:
6 per weight (2 forward, 4 backward) for every parameter outside the model's ``nn.Embedding``
children, and for attention's two products (QKᵀ and AV) 12 per layer ``l``, head ``h``, head
channel ``q`` and position ``t`` of the sequence, causal masking not subtracted. MFU is that
times the tokens each device trains per second, over the device's peak dense bf16 rate
(``989e12`` for an H100 SXM in torchtitan's ``get_peak_flops``). Recomputation is not counted:
MFU measures useful work.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from course_lib.common.models import GPTConfig, get_config, param_count
from course_lib.common.published import published
from course_lib.plan.clusters import get_cluster

__all__ = ["flops_per_token", "gpt_flops_per_token", "llama_flops_per_token", "mfu",
           "PublishedRun", "torchtitan_llama_8b"]

_MODELS = Path(__file__).resolve().parents[2] / "data" / "models"


def flops_per_token(params: int, embedding_params: int, layers: int, heads: int, head_dim: int,
                    seq_len: int) -> float:
    """torchtitan's FLOPs per trained token: ``6 (N − N_emb) + 12 l h q t``."""
    return 6 * (params - embedding_params) + 12 * layers * heads * head_dim * seq_len


def gpt_flops_per_token(config: GPTConfig | str) -> float:
    """The course GPT's: its token and position tables are its ``nn.Embedding`` children."""
    c = get_config(config)
    embedding = (c.vocab_size + c.seq_len) * c.d_model
    return flops_per_token(param_count(c), embedding, c.n_layer, c.n_head, c.head_dim, c.seq_len)


def llama_params(cfg: dict) -> tuple[int, int]:
    """(parameters, embedding parameters) of a dense Llama ``config.json`` (no biases)."""
    h, f, v, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd
    q = cfg["num_attention_heads"] * hd
    block = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
    out = 0 if cfg.get("tie_word_embeddings") else v * h
    return n * block + v * h + h + out, v * h


def llama_flops_per_token(name: str = "llama-3.1-8b", seq_len: int = 8192) -> float:
    """torchtitan's count for a stored Llama config (``data/models/NAME/config.json``)."""
    cfg = json.loads((_MODELS / name / "config.json").read_text())
    params, embedding = llama_params(cfg)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return flops_per_token(params, embedding, cfg["num_hidden_layers"], cfg["num_attention_heads"],
                           hd, seq_len)


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's FLOP/s on one device over that device's peak."""
    if peak_flops <= 0 or tokens_per_s_per_device < 0:
        raise ValueError("need a positive peak and a non-negative throughput")
    return flops_per_token * tokens_per_s_per_device / peak_flops


@dataclass(frozen=True)
class PublishedRun:
    """A published run's figures and the MFU torchtitan's formula gives them."""

    what: str
    tokens_per_s_gpu: float
    memory_gib: float
    flops_per_token: float
    peak_flops: float
    source: str

    @property
    def mfu(self) -> float:
        return mfu(self.flops_per_token, self.tokens_per_s_gpu, self.peak_flops)


def torchtitan_llama_8b() -> PublishedRun:
    """torchtitan's Llama 3.1 8B on 8 H100 (FSDP, local batch 2, sequence 8192, selective AC)."""
    entry = next(e for e in published("12") if e["id"] == "torchtitan-llama31-8b-fsdp")
    peak = get_cluster("h100-96gb").peak_tflops * 1e12
    return PublishedRun(entry["what"], entry["tokens_per_s_gpu"], entry["memory_gib"],
                        llama_flops_per_token("llama-3.1-8b", 8192), peak, entry["source"])
