"""Layouts: which mesh dimensions exist, what makes a layout invalid, and each rank's predicted
model-state bytes — written from the shapes alone, independently of the runs that measure them.

A layout maps mesh dimensions to sizes, e.g. ``{"dp_shard": 2, "tp": 2}``. The prediction reuses
chapter 3's FSDP formula (:func:`course_lib.sharding.formulas.per_rank_bytes`) on the shapes a
rank holds after tensor parallelism (chapter 4's Megatron split) or after expert parallelism.
"""
from __future__ import annotations

import math

from torch.nn import init as nn_init
from torch.overrides import TorchFunctionMode

from course_lib.common.checks import is_int
from course_lib.common.models import GPTConfig
from course_lib.sharding.formulas import param_shapes, per_rank_bytes
from course_lib.tensor_parallel.layers import tp_plan

__all__ = ["RUNNABLE", "MAX_RANKS", "MOE", "KNOWN", "RUN_KNOWN", "validate_layout", "check_layout",
           "tp_shapes", "tp_named_shapes",
           "predict_gpt_bytes", "predict_pp_bytes",
           "moe_shapes", "predict_moe_bytes"]

#: the layouts run_parallel can run (sorted dimension names), and the most ranks it starts
RUNNABLE = {("dp_shard", "tp"), ("dp_replicate", "dp_shard"), ("dp_shard",), ("ep",), ("cp",),
            ("dp_shard", "pp"), ("dp_shard", "pp", "tp"), ("dp",), ("tp",), ("pp",)}
MAX_RANKS = 8
KNOWN = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
#: what a run also accepts: ``"dp"``, plain data parallelism (torch DDP, every rank a full copy)
RUN_KNOWN = ("dp",) + KNOWN
#: the mixture-of-experts layer of the "ep" runs
MOE = {"d_model": 32, "n_experts": 4, "hidden": 64, "top_k": 2}


def validate_layout(layout: object, config: GPTConfig) -> dict[str, int]:
    """Return the layout as a dict, or raise a ``ValueError`` saying what is wrong with it."""
    if not isinstance(layout, dict) or not layout:
        raise ValueError(f"layout must be a non-empty dict of mesh dimension -> size, got {layout!r}")
    for name, size in layout.items():
        if name not in RUN_KNOWN:
            raise ValueError(f"unknown mesh dimension {name!r}; known dimensions: {RUN_KNOWN}")
        if not is_int(size) or size < 1:
            raise ValueError(f"layout[{name!r}] must be a positive integer, got {size!r}")
    world = math.prod(layout.values())
    if world > MAX_RANKS or world < 2:
        raise ValueError(f"layout {layout} needs {world} ranks; run_parallel runs 2 to "
                         f"{MAX_RANKS} ranks on this machine (a product of sizes in that range)")
    dims = tuple(sorted(n for n, s in layout.items()))
    if dims not in RUNNABLE:
        raise ValueError(f"layout {layout}: the combination {dims} is not implemented here; "
                         f"runnable: {sorted(RUNNABLE)}")
    tp = layout.get("tp", 1)
    if config.n_head % tp:
        raise ValueError(f"tp={tp} must divide the {config.n_head} attention heads")
    pp = layout.get("pp", 1)
    if pp not in (1, 2):
        raise ValueError(f"pp={pp}: the hand-written pipeline of this chapter has 2 stages")
    if config.n_layer % pp:
        raise ValueError(f"pp={pp} must divide the {config.n_layer} layers")
    cp = layout.get("cp", 1)
    if config.seq_len % cp:
        raise ValueError(f"cp={cp} must divide the sequence length {config.seq_len}")
    ep = layout.get("ep", 1)
    if MOE["n_experts"] % ep:
        raise ValueError(f"ep={ep} must divide the {MOE['n_experts']} experts")
    return dict(layout)


check_layout = validate_layout  # its name before issue 32 (check_* now means a grader)


class _ShapesOnly(TorchFunctionMode):
    """Skip ``nn.init.normal_`` (the embeddings' init) while a model is built on "meta": a meta
    tensor has no values to fill, and that call alone would load torch's Python meta kernels
    and ``torch._dynamo`` into this process — seconds on 2 cores, for shapes that do not change."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is nn_init.normal_:
            tensor = args[0] if args else kwargs["tensor"]
            if tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def tp_shapes(config: GPTConfig, tp: int) -> list[tuple[int, ...]]:
    """Every parameter's shape on one tensor-parallel rank (Megatron's split, chapter 4)."""
    return [shape for _, shape in tp_named_shapes(config, tp)]


def tp_named_shapes(config: GPTConfig, tp: int, vocab_parallel: bool = False) -> list[tuple]:
    """``(name, shape)`` of every parameter on one tensor-parallel rank.

    Column-parallel linears (qkv, fc) keep 1/tp of their output rows, weight and bias;
    row-parallel ones (attn.proj, mlp.proj) 1/tp of their input columns, bias whole.
    ``vocab_parallel`` also splits ``tok_emb`` and ``lm_head`` by vocabulary rows, as
    Megatron-LM does (the runs of this chapter keep them whole).
    """
    import torch

    from course_lib.common.models import GPT
    with torch.device("meta"), _ShapesOnly():  # one block is enough: the others have the same shapes
        model = GPT(config.replace(n_layer=1))
    named = [(n, p.shape) for n, p in model.named_parameters() if not n.startswith("blocks.")]
    block = [(n.split(".", 2)[2], p.shape) for n, p in model.named_parameters()
             if n.startswith("blocks.")]
    named[2:2] = [(f"blocks.{i}.{n}", shape) for i in range(config.n_layer) for n, shape in block]
    plan, out = tp_plan(), []
    for name, shape in named:
        shape = list(shape)
        style = next((s for m, s in plan.items() if name.startswith("blocks.") and
                      name.split(".", 2)[2].rsplit(".", 1)[0] == m), None)
        if style == "column":
            shape[0] //= tp
        elif style == "row" and len(shape) == 2:
            shape[1] //= tp
        elif vocab_parallel and name in ("tok_emb.weight", "lm_head.weight"):
            shape[0] = -(-shape[0] // tp)
        out.append((name, tuple(shape)))
    return out


def predict_gpt_bytes(config: GPTConfig, layout: dict[str, int]) -> dict[str, int]:
    """One rank's params, grads, optimizer and model_states for a 2-D GPT layout (fp32 Adam);
    ``"dp"`` (DDP) keeps everything whole."""
    shapes = tp_shapes(config, layout["tp"]) if "tp" in layout else param_shapes(config)
    row = per_rank_bytes(shapes, "fsdp", layout.get("dp_shard", 1))[0] if "dp" not in layout \
        else per_rank_bytes(shapes, "ddp", 1)[0]
    return {k: row[k] for k in ("params", "grads", "optimizer", "model_states")}


def predict_pp_bytes(config: GPTConfig, layout: dict[str, int], stage: int) -> dict[str, int]:
    """One rank's model-state bytes in pipeline ``stage``: its blocks (and the embeddings on the
    first stage, ``ln_f`` and ``lm_head`` on the last), split over ``tp`` (Megatron's split of
    the blocks) and FSDP-sharded over ``dp_shard``."""
    pp, per = layout["pp"], config.n_layer // layout["pp"]

    def where(name: str) -> int:
        if name.startswith("blocks."):
            return int(name.split(".")[1]) // per
        return 0 if name.startswith(("tok_emb", "pos_emb")) else pp - 1
    shapes = [s for n, s in tp_named_shapes(config, layout.get("tp", 1)) if where(n) == stage]
    row = per_rank_bytes(shapes, "fsdp", layout.get("dp_shard", 1))[0]
    return {k: row[k] for k in ("params", "grads", "optimizer", "model_states")}


def moe_shapes(ep: int, moe: dict | None = None) -> list[tuple[int, ...]]:
    """The parameter shapes one expert-parallel rank holds: the router and E/ep experts."""
    m = moe or MOE
    d, h = m["d_model"], m["hidden"]
    expert = [(h, d), (h,), (d, h), (d,)]
    return [(m["n_experts"], d)] + expert * (m["n_experts"] // ep)


def predict_moe_bytes(ep: int, moe: dict | None = None) -> dict[str, int]:
    """One rank's model-state bytes for the ``"ep"`` layout (replicated router, E/ep experts)."""
    row = per_rank_bytes(moe_shapes(ep, moe), "ddp", 1)[0]
    return {k: row[k] for k in ("params", "grads", "optimizer", "model_states")}
