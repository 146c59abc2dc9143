"""Predictions: how many bytes training should take, from the sizes alone.

Chapter 1 puts every number here next to a measurement
(:func:`course_lib.memory.tracker.measure_step`); the predictions never read one. **Model
states** (:func:`bytes_per_param`, :func:`model_state_bytes`): fp32 Adam keeps 4 + 4 + 4·2 = 16
B/param (ZeRO's fp16 2 + 2 + 12 is 16 too; :func:`playbook_table`: the Ultra-Scale Playbook's
20), exact to the byte with Adam's 4-byte ``step`` per parameter tensor. **Activations**
(:func:`activation_terms`): what autograd saves in our GPT, derived tensor by tensor, exact on
CPU; :func:`korthikanti_bytes` is Korthikanti et al.'s ``s·b·h·(34 + 5·a·s/h)`` for
comparison; ``recompute="selective"`` drops the attention core's saved tensors, ``"full"`` keeps
only each block's input. **Peak** (:func:`peak_bytes`): the largest of the moments every step
passes through (:func:`part_peak_bytes`: on one rank's part of the model). Derivations: chapter 1.
"""
from __future__ import annotations

from torch import nn

from course_lib.common.dtypes import BF16, BOOL, FP32, INT64
from course_lib.common.models import RECOMPUTE, GPTConfig, get_config, param_count
from course_lib.common.training import OPTIMIZERS, STATES_PER_PARAM, validate_optimizer

__all__ = ["PRECISIONS", "OPTIMIZERS", "RULE_BYTES_PER_PARAM", "validate", "bytes_per_param",
           "model_state_bytes", "gpt_param_tensors", "model_state_bytes_for", "inference_bytes",
           "activation_terms", "activation_bytes", "korthikanti_bytes", "batch_bytes", "root_bytes",
           "peak_bytes", "part_peak_bytes", "predict_step", "MIXED", "ALL_PRECISIONS",
           "PLAYBOOK_SIZES", "playbook_table"]

#: Precisions where grads and optimizer states take the weights' dtype (any optimizer).
PRECISIONS = ("fp32", "amp", "bf16")
#: Precisions whose optimizer keeps fp32 master weights (:mod:`course_lib.memory.mixed`; Adam only).
MIXED = ("mixed", "mixed-fp32-grads")
ALL_PRECISIONS = PRECISIONS + MIXED
#: The rule of thumb for fp32 (or mixed-precision) Adam training.
RULE_BYTES_PER_PARAM = 16

_WEIGHT_BYTES = {"fp32": FP32, "amp": FP32, "bf16": BF16, "mixed": BF16, "mixed-fp32-grads": BF16}
# amp = autocast: fp32 weights, bf16 compute. Mixed: bf16 weights and compute (activations as bf16).
_COMPUTE = {"fp32": "fp32", "amp": "amp", "bf16": "bf16", "mixed": "bf16", "mixed-fp32-grads": "bf16"}


def validate(precision: str = "fp32", optimizer: str = "adam", recompute: str = "none") -> None:
    """Raise a clear ``ValueError`` for an unknown precision, optimizer or recompute mode."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"unknown recompute {recompute!r}; choose one of {RECOMPUTE}")
    if precision not in ALL_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {ALL_PRECISIONS}")
    validate_optimizer(optimizer)
    if precision in MIXED and optimizer not in ("adam", "adamw"):
        raise ValueError(f"precision={precision!r} keeps fp32 master weights for Adam; "
                         f"use optimizer 'adam' or 'adamw', not {optimizer!r}")


def bytes_per_param(precision: str = "fp32", optimizer: str = "adam") -> dict[str, int]:
    """Bytes per parameter of weights, gradients and optimizer states (and their total).

    Gradients and optimizer states take the weights' dtype: fp32 Adam 4+4+8 = 16, AMP (fp32
    weights) 16, bf16 Adam 2+2+4 = 8, fp32 SGD 8, fp32 SGD with momentum 12. ``"mixed"``: bf16
    weights and grads, fp32 master + moments 2+2+12 = 16; ``"mixed-fp32-grads"`` adds the fp32
    gradient accumulator to the grads, 2+(2+4)+12 = 20 (the Ultra-Scale Playbook's column).
    """
    validate(precision, optimizer)
    w = _WEIGHT_BYTES[precision]
    table = {"params": w, "grads": w, "optimizer": STATES_PER_PARAM[optimizer] * w}
    if precision in MIXED:
        table["optimizer"] = FP32 + FP32 * STATES_PER_PARAM[optimizer]
        table["grads"] += FP32 if precision == "mixed-fp32-grads" else 0
    return {**table, "total": sum(table.values())}


def model_state_bytes(n_params: int, precision: str = "fp32", optimizer: str = "adam", *,
                      n_tensors: int = 0, buffer_bytes: int = 0) -> dict[str, int]:
    """Bytes of params, grads, optimizer states and buffers for ``n_params`` parameters.

    ``n_tensors`` (number of parameter tensors) adds Adam's 4-byte fp32 ``step`` counter per
    tensor; ``buffer_bytes`` adds non-trainable buffers. ``model_states`` is the sum.
    """
    per = bytes_per_param(precision, optimizer)
    steps = FP32 * n_tensors if optimizer in ("adam", "adamw") else 0
    out = {"params": per["params"] * n_params, "buffers": buffer_bytes,
           "grads": per["grads"] * n_params, "optimizer": per["optimizer"] * n_params + steps}
    return {**out, "model_states": sum(out.values())}


def gpt_param_tensors(config: GPTConfig) -> int:
    """Number of parameter tensors of ``GPT(config)`` (each gets its own Adam ``step``)."""
    per_layer_norm = 1 + int(config.bias)
    per_block = 2 * per_layer_norm + 4 * (1 + int(config.bias))  # 2 LayerNorms, 4 Linears
    head = per_layer_norm + (0 if config.tie_weights else 1)      # ln_f, lm_head
    return config.n_layer * per_block + 2 + head                    # + tok_emb, pos_emb


def model_state_bytes_for(model: nn.Module | GPTConfig | str, precision: str = "fp32",
                          optimizer: str = "adam") -> dict[str, int]:
    """:func:`model_state_bytes` for a GPT config / preset name (from the formula) or a module."""
    if isinstance(model, nn.Module):
        params = [p for p in model.parameters() if p.requires_grad]
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        return model_state_bytes(sum(p.numel() for p in params), precision, optimizer,
                                 n_tensors=len(params), buffer_bytes=buffers)
    config = get_config(model)
    return model_state_bytes(param_count(config), precision, optimizer,
                             n_tensors=gpt_param_tensors(config))


#: The model sizes of the Ultra-Scale Playbook's memory table.
PLAYBOOK_SIZES = (1_000_000_000, 7_000_000_000, 70_000_000_000, 405_000_000_000)


def playbook_table(sizes: tuple[int, ...] = PLAYBOOK_SIZES) -> list[dict[str, float]]:
    """The Ultra-Scale Playbook's table of model-state memory, in GB (10⁹ bytes) as it prints it.

    Column ``"mixed"``: fp32, or bf16 with fp32 master weights and moments — 16 B/param either
    way (4+4+8 or 2+2+4+8). Column ``"mixed-fp32-grads"``: bf16 with fp32 gradient accumulation,
    2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 grads) + 4 (fp32 master) + 8 (moments) = 20.
    Like the Playbook it leaves out Adam's few step counters.
    """
    row = {p: bytes_per_param(p)["total"] for p in ("fp32", "mixed", "mixed-fp32-grads")}
    return [{"params": n, **{p: b * n / 1e9 for p, b in row.items()}} for n in sizes]


def inference_bytes(n_params: int, precision: str = "fp32") -> int:
    """Weights only: what inference must hold at least (no grads, no optimizer, nothing saved)."""
    validate(precision)
    return _WEIGHT_BYTES[precision] * n_params


def activation_terms(config: GPTConfig | str, batch_size: int, seq_len: int,
                     precision: str = "fp32", recompute: str = "none") -> dict[str, int]:
    """Bytes autograd saves during one forward of ``GPT(config)``, term by term.

    Per layer, with b = batch, s = seq_len, h = d_model, a = n_head:

    * residual stream saved twice (inputs of ln1 and ln2): 2·R·bsh (R = 4 in fp32 and AMP, 2 bf16);
    * LayerNorm outputs (inputs of qkv and fc) 2, qkv 3, attention output 1, fc output 4,
      GELU output 4: 14·A·bsh (A = 4 in fp32, 2 in AMP and bf16);
    * LayerNorm mean and rstd: 4·bs·S (S = 4, except 2 in bf16);
    * attention: SDPA keeps a fp32 log-sum-exp per row, 4·bas; explicit attention keeps the
      softmax A·bas² plus a boolean causal mask s²;
    * AMP only: the bf16 copies of the 12h² linear weights that autocast saves for backward.

    ``recompute="selective"`` drops the attention term (q, k, v stay: the qkv output is kept
    anyway); ``"full"`` keeps only each block's input, R·bsh per layer. Plus the final LayerNorm,
    the logits' fp32 log-softmax (4·bsV), position ids and 8 bytes of loss scalars. Exact for
    the CPU kernels of torch 2.x; GPU kernels may differ by small terms.
    """
    config = get_config(config)
    validate(precision, recompute=recompute)
    precision = _COMPUTE[precision]
    b, s, h, v = batch_size, seq_len, config.d_model, config.vocab_size
    resid, act, stat = _WEIGHT_BYTES[precision], _ACT_BYTES[precision], BF16 if precision == "bf16" else FP32
    layer = resid * b * s * h if recompute == "full" else _layer_bytes(config, b, s, precision, recompute)
    head = (resid + act) * b * s * h + 2 * b * s * stat + (BF16 * v * h if precision == "amp" else 0)
    return {"blocks": config.n_layer * layer, "final_norm": head, "logits": FP32 * b * s * v,
            "positions": INT64 * s, "loss": 2 * FP32}


_ACT_BYTES = {"fp32": FP32, "amp": BF16, "bf16": BF16}


def _layer_bytes(config: GPTConfig, b: int, s: int, precision: str, recompute: str = "none") -> int:
    """What one block saves without recomputation (selective: without the attention core)."""
    h, a = config.d_model, config.n_head
    resid, act, stat = _WEIGHT_BYTES[precision], _ACT_BYTES[precision], BF16 if precision == "bf16" else FP32
    attn = act * b * a * s * s + BOOL * s * s if config.attention == "explicit" else FP32 * b * a * s
    amp_copies = BF16 * 12 * h * h if precision == "amp" else 0
    return ((2 * resid + 14 * act) * b * s * h + 4 * b * s * stat
            + (0 if recompute == "selective" else attn) + amp_copies)


def activation_bytes(config: GPTConfig | str, batch_size: int, seq_len: int,
                     precision: str = "fp32", recompute: str = "none") -> int:
    """Total of :func:`activation_terms`: activations alive at the end of the forward pass."""
    return sum(activation_terms(config, batch_size, seq_len, precision, recompute).values())


def korthikanti_bytes(config: GPTConfig | str, batch_size: int, seq_len: int) -> int:
    """Korthikanti et al.'s ``L·s·b·h·(34 + 5·a·s/h)`` bytes (16-bit, dropout, stored scores)."""
    c = get_config(config)
    sbh = seq_len * batch_size * c.d_model
    return c.n_layer * (34 * sbh + 5 * c.n_head * seq_len * seq_len * batch_size)


def root_bytes(config: GPTConfig, stage: int | None = None, pp: int = 1) -> int:
    """fp32 bytes of the parameters outside the blocks that pipeline ``stage`` of ``pp`` holds
    (``None``: all): the embeddings on the first, the final LayerNorm and the head on the last."""
    h, v, first, last = config.d_model, config.vocab_size, stage in (None, 0), stage in (None, pp - 1)
    emb = v * h + config.seq_len * h if first else 0
    head = (1 + config.bias) * h + (0 if config.tie_weights and first else v * h)  # ln_f, lm_head
    return FP32 * (emb + (head if last else 0))


def part_peak_bytes(config: GPTConfig, batch_size: int, states: dict, *, tp: int = 1,
                    blocks: int | None = None, first: bool = True, last: bool = True,
                    extra: int = 0, kept_grads: bool = False) -> int:
    """:func:`peak_bytes`'s two moments (fp32 Adam) on a rank holding part of ``GPT(config)``:
    ``blocks`` blocks, the embeddings if ``first``, the head if ``last``; ``states`` its
    ``params``/``grads``/``optimizer`` bytes. ``tp`` splits what a block saves inside attention
    and the MLP (chapter 04). A part before the last holds its output and the buffer its gradient
    comes back in; its largest backward temporary is the MLP's hidden-layer gradient. ``extra``:
    bytes alive through backward (FSDP2's gathered root); ``kept_grads``: DDP's flat buckets."""
    b, s, h = batch_size, config.seq_len, config.d_model
    terms, bsh = activation_terms(config, b, s), FP32 * b * s * h
    inner = 12 * bsh + FP32 * b * config.n_head * s  # qkv, attention out, fc, GELU; log-sum-exp
    layer = terms["blocks"] // config.n_layer - (inner - inner // tp)
    acts = (config.n_layer if blocks is None else blocks) * layer + (terms["positions"] if first else 0)
    if last:  # the head's activations; the log-softmax's and the logits' gradients
        acts += terms["final_norm"] + terms["logits"] + terms["loss"]
        temps = 2 * FP32 * b * s * config.vocab_size
    else:  # the output it holds and the buffer its gradient arrives in
        acts, temps = acts + 2 * bsh, 4 * bsh // tp
    fixed = states["params"] + states["optimizer"] + batch_bytes(b, s) + kept_grads * states["grads"]
    return max(fixed + acts + temps + extra, fixed + states["grads"])


def batch_bytes(batch_size: int, seq_len: int) -> int:
    """Bytes of one ``(inputs, targets)`` batch of int64 token ids."""
    return 2 * INT64 * batch_size * seq_len


def flow_bytes(config: GPTConfig, shape: tuple[int, ...], precision: str) -> int:
    """Activations, the logits' gradient temporaries and the batch: what flows through a step."""
    b, s = shape[0], shape[1]
    return (activation_bytes(config, b, s, precision) + 2 * FP32 * b * s * config.vocab_size
            + batch_bytes(b, s))


def predict_step(config: GPTConfig | str, batch_size: int, seq_len: int, precision: str = "fp32",
                 optimizer: str = "adam", recompute: str = "none") -> dict[str, int]:
    """Every category of a :class:`~course_lib.memory.report.MemoryReport`, predicted.

    ``temporaries`` is what the peak moment of :func:`peak_bytes` holds in backward
    temporaries: the logits' gradients (2·4·bsV) at the start of backward, the gradients inside
    the first block under full recomputation, nothing at the end of backward.
    """
    c = get_config(config)
    out = model_state_bytes_for(c, precision, optimizer)
    total, temporaries = max(_moments(c, batch_size, seq_len, precision, optimizer, recompute).values())
    out.update(activations=activation_bytes(c, batch_size, seq_len, precision, recompute),
               temporaries=temporaries, inputs=batch_bytes(batch_size, seq_len), peak=total)
    return out


def peak_bytes(config: GPTConfig | str, batch_size: int, seq_len: int, precision: str = "fp32",
               optimizer: str = "adam", recompute: str = "none") -> int:
    """Predicted peak of a steady-state step: the largest of the moments it passes through.

    *Start of backward*: params + optimizer states + all activations + the fp32 gradients of the
    log-softmax and logits (2·4·bsV); grads were freed by ``zero_grad`` (except the fp32
    accumulators of ``"mixed-fp32-grads"``). *End of backward*: params + grads + optimizer
    states. Mixed precision also *the optimizer step*: the largest tensor's fp32 gradient copy
    (not with fp32 grads) and two fp32 temporaries of torch's Adam. With ``recompute="full"`` also *the first block's backward*: every block's input
    (kept), block 1 recomputed (less its GELU output, already used), the grads of everything
    above it, and the gradients flowing through its MLP, (R + 8·A)·bsh. The true peak can be a
    little higher (gradients held inside backward), so this is close to a lower bound.
    """
    c = get_config(config)
    return max(_moments(c, batch_size, seq_len, precision, optimizer, recompute).values())[0]


def _moments(c: GPTConfig, b: int, s: int, precision: str, optimizer: str,
             recompute: str) -> dict[str, tuple[int, int]]:
    """Moment name -> (total bytes alive, of which backward temporaries)."""
    validate(precision, optimizer, recompute)
    states = model_state_bytes_for(c, precision, optimizer)
    n = param_count(c)
    kept = FP32 * n if precision == "mixed-fp32-grads" else 0  # fp32 grads outlive zero_grad
    fixed = states["params"] + states["optimizer"] + kept + batch_bytes(b, s)
    logits_grads = 2 * FP32 * b * s * c.vocab_size
    out = {"start of backward": (fixed + activation_bytes(c, b, s, precision, recompute)
                                 + logits_grads, logits_grads),
           "end of backward": (fixed - kept + states["grads"], 0)}
    if precision in MIXED:  # the step upcasts one gradient at a time; Adam's math adds two temporaries
        h, v = c.d_model, c.vocab_size
        largest = FP32 * max(v * h, 4 * h * h, c.seq_len * h)
        temps = (3 if precision == "mixed" else 2) * largest
        out["optimizer step"] = (fixed - kept + states["grads"] + temps, 0)
    if recompute == "full":
        p, h, bias, bsh = _COMPUTE[precision], c.d_model, int(c.bias), b * s * c.d_model
        resid, act, g = _WEIGHT_BYTES[p], _ACT_BYTES[p], (states["grads"] - kept) // n
        not_yet = (12 * h * h + 2 * h + 11 * bias * h) - (4 * h * h + bias * h) \
            + c.seq_len * h + (0 if c.tie_weights else c.vocab_size * h)  # block 1 but mlp.proj; embeddings
        recomputed = _layer_bytes(c, b, s, p) - resid * bsh - 4 * act * bsh
        temps = (resid + 8 * act) * bsh
        inputs_kept = c.n_layer * resid * bsh + INT64 * s + 2 * FP32
        out["first block's backward"] = (fixed + inputs_kept + recomputed + states["grads"] - kept
                                         - g * not_yet + temps, temps)
    return out
