"""Before the run: each rank's peak bytes for a layout, from chapter 01's predictor.

Chapter 01's moments (:func:`course_lib.memory.predict.peak_bytes`) on this rank's share:
*start of backward* (params + Adam states + the batch + every saved activation + the logits'
gradients) and *end of backward* (params + grads + Adam states), with this rank's model-state
bytes from chapter 09's layouts. The layout changes the share: data parallelism splits the
batch, TP splits what a block saves inside attention and the MLP (not the residual stream or
the LayerNorm outputs), PP keeps its stage's blocks (a stage before the last also its output
and the buffer the gradient comes back in, and its largest backward temporary is the MLP's
hidden-layer gradient, not the logits'), FSDP2 holds the root's gathered parameters
(embeddings, head) through backward, DDP one bucket copy of the gradients. Close to a lower
bound, like chapter 01's: other gradients in flight inside backward are left out.
"""
from __future__ import annotations

import math

from course_lib.common.dtypes import FP32
from course_lib.common.models import GPTConfig
from course_lib.memory.predict import activation_terms, batch_bytes

__all__ = ["predict_peak", "root_bytes"]


def root_bytes(config: GPTConfig, stage: int | None = None, pp: int = 1) -> int:
    """fp32 bytes of the parameters outside the blocks that ``stage`` holds: the embeddings on
    the first, the final LayerNorm and the head on the last (FSDP2's root unit)."""
    h, v = config.d_model, config.vocab_size
    first = stage is None or stage == 0
    last = stage is None or stage == pp - 1
    emb = v * h + config.seq_len * h if first else 0
    head = 2 * h + (0 if config.tie_weights and first else v * h) + (v if config.bias else 0)
    return FP32 * (emb + (head if last else 0))


def predict_peak(config: GPTConfig, layout: dict[str, int], batch_size: int, states: dict,
                 stage: int | None = None) -> int:
    """Predicted peak bytes of one rank's steady training step (fp32, Adam): ``batch_size`` is
    the global batch, ``states`` the rank's predicted ``params``/``grads``/``optimizer``,
    ``stage`` its pipeline stage (``None`` without ``pp``)."""
    dp = math.prod(layout.get(n, 1) for n in ("dp", "dp_replicate", "dp_shard"))
    tp, pp = layout.get("tp", 1), layout.get("pp", 1)
    b, s, h = batch_size // dp, config.seq_len, config.d_model
    terms = activation_terms(config, b, s)
    bsh = FP32 * b * s * h
    layer = terms["blocks"] // config.n_layer
    inner = 12 * bsh + FP32 * b * config.n_head * s  # qkv, attention out, fc, GELU; log-sum-exp
    layer -= inner - inner // tp
    first = stage is None or stage == 0
    last = stage is None or stage == pp - 1
    acts = config.n_layer // pp * layer + (terms["positions"] if first else 0)
    if last:
        acts += terms["final_norm"] + terms["logits"] + terms["loss"]
        temps = 2 * FP32 * b * s * config.vocab_size  # log-softmax's and the logits' gradients
    else:  # a stage before the last: the output it holds and the buffer its gradient arrives in;
        acts += 2 * bsh  # no logits, so the largest backward temporary is the MLP's hidden one
        temps = 4 * bsh // tp
    gathered = root_bytes(config, stage, pp) if "dp_shard" in layout else 0
    buckets = states["grads"] if "dp" in layout else 0  # DDP's flat gradient buckets
    fixed = states["params"] + states["optimizer"] + batch_bytes(b, s) + buckets
    return max(fixed + acts + temps + gathered, fixed + states["grads"])
