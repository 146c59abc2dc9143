"""Checks for the exercises of chapter 7 (``07_before_you_distribute``).

The number and choice checks compute their expected value from the course's own functions
(never printed) and return a :class:`course_lib.exercises.Feedback`. The two code exercises return
``(passed, message)`` for :func:`course_lib.check_true`: :func:`check_int8_per_tensor` compares
the learner's absmax int8 with ``torch.quantize_per_tensor``; :func:`check_merge_lora` merges
LoRA adapters trained on real ranks and compares the merged model's logits with the LoRA model's.
``tests/finetuning/`` calls them with the solutions and with plausible mistakes.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.checks import positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config, param_count
from course_lib.exercises import Feedback, check_choice, check_number
from course_lib.finetuning.lora import LoRALinear, add_lora, lora_param_count, merge_lora
from course_lib.launcher.launch import run
from course_lib.sharding.formulas import paper_bytes

__all__ = ["check_lora_params", "check_13b_zero2", "check_capstone", "check_int8_per_tensor",
           "check_merge_lora"]


def check_lora_params(answer: object) -> Feedback:
    """Trainable LoRA parameters, r = 8, adapters on ``attn.qkv`` and ``mlp.fc`` of ``"small"``."""
    return check_number(answer, lora_param_count("small", 8, ("attn.qkv", "mlp.fc")),
                        name="LoRA parameters", hint="r·(in + out) per wrapped linear, per layer")


def check_13b_zero2(answer: object) -> Feedback:
    """Do a 13B model's model states fit on 8 × 40 GB with ZeRO-2 (paper's 2Ψ + 14Ψ/N, 16-bit)?"""
    fits = paper_bytes(13e9, 8)["zero2"] <= 40e9
    return check_choice(answer, "yes" if fits else "no", ["yes", "no"], name="13B on 8 × 40 GB",
                        hint="ZeRO-2 keeps the full 16-bit parameters on every GPU")


def check_capstone(answer: object) -> Feedback:
    """Fewest 24 GB GPUs for full fine-tuning gpt-7b with FSDP: 16 B/param sharded ideally, 4 GB
    per GPU kept for activations and temporaries."""
    need = math.ceil(16 * param_count(get_config("gpt-7b")) / (24e9 - 4e9))
    return check_number(answer, need, name="capstone: GPUs", unit="GPUs",
                        hint="model states / (GPU memory − headroom), rounded up")


def _int8_reference(w: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's own per-tensor int8 quantization of ``w`` (symmetric: zero point 0)."""
    with warnings.catch_warnings():  # torch 2.13 deprecates the quantized dtypes, they still work
        warnings.simplefilter("ignore")
        ref = torch.quantize_per_tensor(w, scale, 0, torch.qint8)
        return ref.int_repr(), ref.dequantize()


def check_int8_per_tensor(quantize_fn: Callable, dequantize_fn: Callable,
                          seed: int = 0) -> tuple[bool, str]:
    """The learner's per-tensor absmax int8 vs ``torch.quantize_per_tensor`` (zero point 0).

    ``quantize_fn(w) -> (q, scale)`` must give ``scale = max|w| / 127`` and exactly torch's int8
    values (a tie at .5 may round either way); ``dequantize_fn(q, scale)`` torch's fp32 values.
    Returns ``(passed, message)`` for :func:`course_lib.check_true`.
    """
    for fn in (quantize_fn, dequantize_fn):
        if not callable(fn):
            raise TypeError(f"pass your functions themselves (no parentheses), got {type(fn).__name__}")
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 256, generator=gen) * 0.02
    w[3, 7] = 0.25                                          # one outlier sets the scale
    scale_ref = w.abs().max().item() / 127
    q_ref, deq_ref = _int8_reference(w, scale_ref)
    out = quantize_fn(w.clone())
    if not (isinstance(out, tuple) and len(out) == 2):
        return False, f"quantize should return (q, scale), got {type(out).__name__}."
    q, scale = out
    if not isinstance(q, torch.Tensor) or q.shape != w.shape:
        return False, f"q should be a tensor of the weight's shape {tuple(w.shape)}."
    if q.dtype != torch.int8:
        return False, f"q has dtype {q.dtype}: int8 weights need torch.int8 (signed, 1 byte)."
    scale = float(scale)
    if abs(scale - scale_ref) > 1e-6 * scale_ref:
        ratio = scale / scale_ref
        how = f"{ratio:.3g}× the right one" if ratio > 0 else "not positive"
        return False, (f"your scale is {how}: after scaling, the largest |w| must land on the "
                       "largest int8 level you use.")
    exact = w.double() / scale_ref
    tie = (exact - exact.floor() - 0.5).abs() < 1e-4          # either rounding is fine here
    off = ((q.int() - q_ref.int()).abs() > 0) & ~tie
    if off.any():
        toward_zero = (q.int().abs() <= q_ref.int().abs()).all().item()
        return False, (f"{int(off.sum())} of {w.numel()} int8 values differ from torch's"
                       + (", always toward zero: round to the nearest level, do not truncate."
                          if toward_zero else "."))
    deq = dequantize_fn(q_ref.clone(), scale)
    if not isinstance(deq, torch.Tensor) or deq.dtype != torch.float32 or deq.shape != w.shape:
        return False, "dequantize should return a float32 tensor of the weight's shape."
    if not torch.allclose(deq, deq_ref, rtol=1e-6, atol=1e-9):
        return False, ("dequantized values differ from torch's: each int8 value times the "
                       "scale, nothing else.")
    err = (deq - w).abs().max().item()
    return True, (f"equal to torch.quantize_per_tensor; the largest error is "
                  f"{err / scale_ref:.2f} of a step (at most half a step).")


def _merge_rank(fn: Callable, seed: int, steps: int) -> dict:
    """On each rank: DDP-train a LoRA tiny GPT a few steps, merge every adapter, compare."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = add_lora(GPT(get_config("tiny")), r=4, alpha=8.0)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    ddp = DDP(model)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(steps):
        x, y = get_batch(2, 16, seed=seed, step=step, rank=rank, world_size=world)
        GPT.loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
    x, _ = get_batch(2, 16, seed=seed + 1, rank=rank, world_size=world)
    with torch.no_grad():
        expected = model(x)
        plain = GPT(get_config("tiny"))
        state, max_diff = {}, 0.0
        for name, module in model.named_modules():
            if isinstance(module, LoRALinear):
                before = module.base.weight.detach().clone()
                merged = fn(module)
                if not isinstance(merged, torch.Tensor):
                    return {"error": f"your function returned {type(merged).__name__} for "
                                     f"{name}, not a tensor"}
                if not torch.equal(module.base.weight, before):
                    return {"error": f"your function changed the frozen base weight of {name}; "
                                     "the LoRA layer would now apply its update twice"}
                if merged.shape != before.shape:
                    return {"error": f"the merged weight of {name} has shape "
                                     f"{tuple(merged.shape)}, the layer's weight {tuple(before.shape)}"}
                state[name + ".weight"] = merged.detach().float()
                state[name + ".bias"] = module.base.bias
                max_diff = max(max_diff, (merge_lora(module) - merged.float()).abs().max().item())
        rest = {n.replace(".base.", "."): p for n, p in model.state_dict().items()
                if ".A" not in n and ".B" not in n}
        plain.load_state_dict({**rest, **state})
        out_diff = (plain(x) - expected).abs().max().item()
    frozen = all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    return {"weight_diff": max_diff, "out_diff": out_diff, "frozen": frozen}


def check_merge_lora(fn: Callable, world: int = 2, seed: int = 0, steps: int = 2
                     ) -> tuple[bool, str]:
    """The learner's ``merge(layer)`` on every adapter of a LoRA GPT trained ``steps`` with DDP.

    Runs on ``world`` real ranks: training changes only ``A`` and ``B`` (checked), then each
    rank builds a plain GPT whose adapted linears hold the learner's merged weights; its logits
    must equal the LoRA model's, and the weights :func:`course_lib.finetuning.lora.merge_lora`'s.
    """
    if not callable(fn):
        raise TypeError(f"pass your function itself (no parentheses), got {type(fn).__name__}")
    positive_int(world, "world")
    results = run(_merge_rank, world, fn, seed, steps, threads=1)
    for rank, res in enumerate(results):
        if "error" in res:
            return False, f"on rank {rank}: {res['error']}."
        if not res["frozen"]:
            return False, f"on rank {rank} training changed a frozen base weight (add_lora)."
        if res["weight_diff"] > 1e-5 or res["out_diff"] > 1e-4:
            return False, (f"on rank {rank} the merged model's logits differ from the LoRA "
                           f"model's by {res['out_diff']:.2g}: the merged weight is not what the "
                           "layer computes (look at the factor in front of B·A, and the order).")
    return True, (f"after {steps} DDP steps on {world} ranks (only A and B trained), a plain GPT "
                  "with your merged weights gives the LoRA model's logits.")
