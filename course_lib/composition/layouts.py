"""Layouts: which mesh dimensions exist, what makes a layout invalid, and each rank's predicted
model-state bytes — written from the shapes alone, independently of the runs that measure them.

A :class:`~course_lib.composition.layout.Layout` names the mesh's sizes. The prediction reuses
chapter 3's FSDP formula (:func:`course_lib.sharding.formulas.per_rank_bytes`) on the shapes a
rank holds after tensor parallelism (chapter 4's Megatron split) or after expert parallelism.
"""
from __future__ import annotations

from torch.nn import init as nn_init
from torch.overrides import TorchFunctionMode

from course_lib.common.deprecation import renamed
from course_lib.common.models import GPTConfig
from course_lib.composition.layout import MAX_RANKS, MESH_ORDER, MOE, RUNNABLE, Layout
from course_lib.sharding.formulas import per_rank_bytes
from course_lib.tensor_parallel.layers import tp_plan

__all__ = ["RUNNABLE", "MAX_RANKS", "MOE", "KNOWN", "RUN_KNOWN", "validate_layout",
           "tp_shapes", "tp_named_shapes", "stage_shapes",
           "predict_gpt_bytes", "predict_pp_bytes",
           "moe_shapes", "predict_moe_bytes"]

#: the dimensions a layout at scale may name; a run also accepts ``"dp"`` (torch DDP)
KNOWN = tuple(n for n in MESH_ORDER if n != "dp")
RUN_KNOWN = MESH_ORDER


def validate_layout(layout: object, config: GPTConfig) -> Layout:
    """:meth:`Layout.parse` for ``run_parallel``: the layout, or a ``ValueError`` saying why not."""
    return Layout.parse(layout, config)


__getattr__ = renamed(__name__, {"check_layout": "validate_layout"})  # before issue 32


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


def _states(row: dict) -> dict[str, int]:
    return {k: row[k] for k in ("params", "grads", "optimizer", "model_states")}


def predict_gpt_bytes(config: GPTConfig, layout: Layout) -> dict[str, int]:
    """One rank's params, grads, optimizer and model_states for a GPT layout without ``pp``
    (fp32 Adam): :func:`predict_pp_bytes` of its one stage."""
    return predict_pp_bytes(config, layout, 0)


def stage_shapes(config: GPTConfig, tp: int, pp: int, stage: int,
                 vocab_parallel: bool = False) -> list[tuple[int, ...]]:
    """The parameter shapes of pipeline ``stage`` (of ``pp``) on one tensor-parallel rank:
    ``ceil(n_layer / pp)`` blocks, the embeddings on the first stage, ``ln_f`` and ``lm_head``
    on the last (:func:`tp_named_shapes`)."""
    per, named = -(-config.n_layer // pp), tp_named_shapes(config, tp, vocab_parallel)
    return [s for n, s in named if (int(n.split(".")[1]) < per if n.startswith("blocks.") else
                                    stage == (0 if n.startswith(("tok_emb", "pos_emb")) else pp - 1))]


def predict_pp_bytes(config: GPTConfig, layout: Layout, stage: int,
                     vocab_parallel: bool = False) -> dict[str, int]:
    """One rank's model-state bytes in pipeline ``stage`` (without ``pp``: 0, the whole model):
    its :func:`stage_shapes` under ``tp`` (Megatron's split of the blocks), FSDP-sharded over
    ``dp_shard`` (whole under ``"dp"``)."""
    shapes = stage_shapes(config, layout.tp, layout.pp, stage, vocab_parallel)
    return _states(per_rank_bytes(shapes, "fsdp", layout.dp_shard)[0])


def moe_shapes(ep: int, moe: dict | None = None) -> list[tuple[int, ...]]:
    """The parameter shapes one expert-parallel rank holds: the router and E/ep experts."""
    m = moe or MOE
    d, h = m["d_model"], m["hidden"]
    expert = [(h, d), (h,), (d, h), (d,)]
    return [(m["n_experts"], d)] + expert * (m["n_experts"] // ep)


def predict_moe_bytes(ep: int, moe: dict | None = None) -> dict[str, int]:
    """One rank's model-state bytes for the ``"ep"`` layout (replicated router, E/ep experts)."""
    shapes = moe_shapes(ep, moe)
    return _states(per_rank_bytes(shapes, "ddp", 1)[0])
