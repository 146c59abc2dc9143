"""Megatron-core's tensor-parallel layers on the course block, and Megatron-LM's flags (chapter 4).

Chapter 4's split (:mod:`course_lib.tensor_parallel.layers`), built from the real library,
``megatron-core``. :class:`MegatronBlock` is the course :class:`~course_lib.common.models.Block`
with ``ColumnParallelLinear`` ``attn.qkv``/``mlp.fc`` and ``RowParallelLinear``
``attn.proj``/``mlp.proj``, weights copied from the dense block so outputs and gradients compare.
:func:`megatron_block_rank` is one rank's run (megatron's global ``parallel_state`` set up and
destroyed around the dense, Megatron, hand and DTensor blocks). :func:`megatron_status` says
``(ok, reason)``: can megatron-core run here (only the warm server imports it, via
:mod:`~course_lib.tensor_parallel.megatron_preload`); if not, the notebook uses the hand and
DTensor versions. :func:`megatron_layout` turns Megatron-LM's ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size`` and the world size into the data-parallel size.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.common.checks import positive_int
from course_lib.common.models import Block, GPTConfig, get_config
from course_lib.launcher.launch import run
from course_lib.tensor_parallel.layers import validate_tp_degree, qkv_rows
from course_lib.tensor_parallel.measure import (TPReport, TP_CONFIG, dense_block_run,
                                                hand_or_dtensor_report, measure_tp, tp_report)

__all__ = ["megatron_status", "MegatronBlock", "megatron_block_rank", "compare_megatron",
           "tp_with_fallback", "quiet_megatron", "MegatronLayout", "megatron_layout",
           "FLAG_CHAPTERS"]

_MODULES = ("megatron.core.parallel_state", "megatron.core.model_parallel_config",
            "megatron.core.tensor_parallel")


@contextlib.contextmanager
def quiet_megatron():
    """Silence megatron-core's warnings about optional GPU extras (Apex, Transformer Engine,
    CUDA_DEVICE_MAX_CONNECTIONS) and its TorchScript deprecations: none changes what runs on CPU."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"megatron\.")
        warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|CUDA_DEVICE_MAX|torch.jit).*")
        yield


def _import_megatron() -> tuple:
    """(parallel_state, ModelParallelConfig, ColumnParallelLinear, RowParallelLinear)."""
    with quiet_megatron():
        state, config, layers = (importlib.import_module(name) for name in _MODULES)
    return state, config.ModelParallelConfig, layers.ColumnParallelLinear, layers.RowParallelLinear


#: what the warm server imports before forking a rank that uses megatron-core: it pays the
#: import (seconds, torch's inductor included) once per kernel, and this process never does
_PRELOAD = ("course_lib.tensor_parallel.megatron_preload",)


def _probe_megatron(modules: tuple[str, ...]) -> tuple[bool, str]:
    """Inside a rank: import ``modules`` (already there when the warm server could import them);
    ``(True, version)`` or ``(False, "ErrorType: message")``."""
    try:
        with quiet_megatron():
            for name in modules:
                importlib.import_module(name)
        return True, importlib.import_module("megatron.core").__version__
    except Exception as exc:   # ImportError, or whatever a broken install raises on import
        return False, f"{type(exc).__name__}: {exc}"


_probe_megatron.preimport = _PRELOAD


def megatron_status() -> tuple[bool, str]:
    """``(ok, reason)``: can megatron-core's tensor-parallel layers be imported and used here?

    Asked of one rank forked from the warm server (a fraction of a second once the server has
    imported megatron-core, which every Megatron launch needs anyway): this process never
    imports megatron-core, so chapter 4's first cell stays fast."""
    ok, what = run(_probe_megatron, 1, _MODULES, threads=1)[0]
    if not ok:
        return False, (f"megatron-core is not usable here ({what}). "
                       f"Falling back to the hand-written Megatron-style TP and DTensor, which "
                       f"split the block the same way.")
    return True, (f"megatron-core {what}: ColumnParallelLinear / RowParallelLinear run on CPU "
                  f"with gloo (use_cpu_initialization=True)")


def _copy(layer: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


class MegatronBlock(nn.Module):
    """A dense :class:`Block` rebuilt with megatron-core layers on a ``t``-way TP group.

    The layers hold rank ``r``'s shard: ``ColumnParallelLinear`` ``(out/t, in)`` rows,
    ``RowParallelLinear`` ``(out, in/t)`` columns plus the full bias, which it adds after its
    all-reduce. f and g of the hand version are inside the layers: ``ColumnParallelLinear``
    all-reduces its input gradient in backward, ``RowParallelLinear`` its output in forward.
    The qkv rows are copied in :func:`qkv_rows` order (q, k, v of this rank's heads) — Megatron's
    own models interleave q, k, v per head in their checkpoints for the same reason.
    """

    def __init__(self, dense: Block, config: GPTConfig, rank: int, t: int) -> None:
        super().__init__()
        _, ModelParallelConfig, Column, Row = _import_megatron()
        mp = ModelParallelConfig(tensor_model_parallel_size=t, use_cpu_initialization=True,
                                 perform_initialization=False)   # weights are copied below
        h, per, width = config.d_model, config.d_model // t, 4 * config.d_model // t
        kw = dict(config=mp, init_method=nn.init.zeros_, bias=config.bias)
        rows, hidden = qkv_rows(config, rank, t), slice(rank * width, (rank + 1) * width)
        a, m = dense.attn, dense.mlp
        self.head_dim = config.head_dim
        self.ln1, self.ln2 = copy.deepcopy(dense.ln1), copy.deepcopy(dense.ln2)   # replicated
        self.attn, self.mlp = nn.Module(), nn.Module()
        bias = (lambda b, idx: None if b is None else b.detach()[idx])
        self.attn.qkv = _copy(Column(h, 3 * h, gather_output=False, **kw), a.qkv.weight.detach()[rows],
                              bias(a.qkv.bias, rows))
        self.attn.proj = _copy(Row(h, h, input_is_parallel=True, skip_bias_add=False, **kw),
                               a.proj.weight.detach()[:, rank * per:(rank + 1) * per], bias(a.proj.bias, ...))
        self.mlp.fc = _copy(Column(h, 4 * h, gather_output=False, **kw), m.fc.weight.detach()[hidden],
                            bias(m.fc.bias, hidden))
        self.mlp.proj = _copy(Row(4 * h, h, input_is_parallel=True, skip_bias_add=False, **kw),
                              m.proj.weight.detach()[:, hidden], bias(m.proj.bias, ...))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv, _ = self.attn.qkv(self.ln1(x))          # megatron layers return (output, bias)
        q, k, v = qkv.view(b, s, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)   # local heads
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.proj(y.transpose(1, 2).reshape(b, s, -1))[0]
        hidden, _ = self.mlp.fc(self.ln2(x))
        return x + self.mlp.proj(F.gelu(hidden))[0]


def megatron_block_rank(config: GPTConfig, batch: int = 2, seed: int = 0,
                        compare: tuple[str, ...] = ("hand", "dtensor")) -> dict[str, TPReport]:
    """Run on every rank: the Megatron-core block and the ``compare`` implementations, each held
    against the same dense run (:func:`~course_lib.tensor_parallel.measure.dense_block_run`)."""
    parallel_state = _import_megatron()[0]
    rank, t = dist.get_rank(), dist.get_world_size()
    ref = dense_block_run(config, batch, seed)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=t)
    try:
        with quiet_megatron():
            reports = {"megatron": tp_report(ref, "megatron", MegatronBlock(ref.dense, config, rank, t))}
    finally:
        parallel_state.destroy_model_parallel()   # global state: never leak it into the next run
    if parallel_state.model_parallel_is_initialized():
        raise RuntimeError("megatron's parallel_state survived destroy_model_parallel()")
    for impl in compare:
        reports[impl] = hand_or_dtensor_report(ref, impl)
    return reports


megatron_block_rank.preimport = _PRELOAD


def compare_megatron(t: int = 2, config: GPTConfig | str = TP_CONFIG, batch: int = 2, seed: int = 0,
                     compare: tuple[str, ...] = ("hand", "dtensor"), timeout: float = 120.0,
                     run_report=None, *, probe: bool = True) -> list[dict[str, TPReport]]:
    """Run :func:`megatron_block_rank` on ``t`` ranks (one thread each); per rank, a dict
    ``impl -> TPReport``. Bad requests fail here, before any process starts; a megatron-core that
    cannot be imported, before the ``t`` ranks start (:func:`megatron_status` asks one rank,
    unless ``probe=False``: the caller has asked). ``run_report`` (a ``RunReport``) receives
    the ranks' exit codes."""
    config = get_config(config)
    validate_tp_degree(config, t)
    if config.attention != "sdpa":
        raise ValueError("the Megatron-core block implements attention='sdpa' only")
    unknown = set(compare) - {"hand", "dtensor"}
    if unknown:
        raise ValueError(f"compare may name 'hand' and 'dtensor' only, got {sorted(unknown)}")
    ok, reason = megatron_status() if probe else (True, "")
    if not ok:
        raise RuntimeError(reason)
    return run(megatron_block_rank, t, config, batch, seed, tuple(compare), timeout=timeout, threads=1,
               report=run_report)


def tp_with_fallback(t: int = 2, config: GPTConfig | str = TP_CONFIG, batch: int = 2,
                     seed: int = 0) -> tuple[bool, str, list[dict[str, TPReport]]]:
    """``(ok, reason, per-rank reports)``: Megatron-core, hand and DTensor in one launch when
    megatron-core is usable; otherwise the hand-written and DTensor blocks alone (the notebook's
    fallback, so the chapter still runs where megatron-core cannot)."""
    ok, reason = megatron_status()
    if ok:   # asked once: no second probe inside compare_megatron
        return ok, reason, compare_megatron(t, config, batch, seed, probe=False)
    hand, dtensor = (measure_tp(t, impl, config, batch, seed) for impl in ("hand", "dtensor"))
    return ok, reason, [{"hand": h, "dtensor": d} for h, d in zip(hand, dtensor)]


#: Where this course ran what each Megatron-LM parallelism flag asks for.
FLAG_CHAPTERS = {
    "--tensor-model-parallel-size": "04 §1: hand TP, DTensor, Megatron-core layers",
    "--pipeline-model-parallel-size": "04 §2: GPipe/1F1B by hand, torch pipelining",
    "data-parallel size": "02 DDP; 03 ZeRO/FSDP (--use-distributed-optimizer ~ ZeRO-1)",
    "--sequence-parallel": "04 §1: explained; needs CUDA in megatron-core 0.16",
}


@dataclass(frozen=True)
class MegatronLayout:
    """How Megatron-LM lays out ``world`` ranks: TP × PP × DP, and micro-batches per step."""

    world: int
    tp: int
    pp: int
    dp: int
    sequence_parallel: bool
    micro_batches: int | None

    def rows(self) -> list[tuple[str, str, str]]:
        """(flag or quantity, value, where the course ran it) for a table."""
        out = [(flag, str(value), FLAG_CHAPTERS[flag]) for flag, value in (
            ("--tensor-model-parallel-size", self.tp), ("--pipeline-model-parallel-size", self.pp))]
        out.append(("DP = world / (TP x PP)", f"{self.world} / ({self.tp} x {self.pp}) = {self.dp}",
                    FLAG_CHAPTERS["data-parallel size"]))
        out.append(("--sequence-parallel", str(self.sequence_parallel), FLAG_CHAPTERS["--sequence-parallel"]))
        if self.micro_batches is not None:
            out.append(("micro-batches = global / (micro x DP)", str(self.micro_batches),
                        "04 §2: the m of (p-1)/(m+p-1)"))
        return out

    def table(self) -> str:
        """The rows as a fixed-width text table."""
        rows = [("flag / quantity", "value", "in this course")] + self.rows()
        w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
        return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows)


def megatron_layout(world_size: int, tensor_model_parallel_size: int = 1,
                    pipeline_model_parallel_size: int = 1, sequence_parallel: bool = False,
                    micro_batch_size: int | None = None,
                    global_batch_size: int | None = None) -> MegatronLayout:
    """Megatron-LM's arithmetic: DP = world / (TP × PP); micro-batches = global / (micro × DP).

    Raises ``ValueError`` when the sizes do not divide, as Megatron-LM refuses to start then.
    ``--sequence-parallel`` needs TP > 1 (Megatron-LM switches it off at TP = 1): an error here.
    """
    world = positive_int(world_size, "world size")
    tp = positive_int(tensor_model_parallel_size, "--tensor-model-parallel-size")
    pp = positive_int(pipeline_model_parallel_size, "--pipeline-model-parallel-size")
    if world % (tp * pp):
        raise ValueError(f"world size {world} is not divisible by --tensor-model-parallel-size "
                         f"{tp} x --pipeline-model-parallel-size {pp} = {tp * pp}: "
                         f"Megatron-LM needs world = TP x PP x DP")
    dp = world // (tp * pp)
    if sequence_parallel and tp == 1:
        raise ValueError("--sequence-parallel splits activations across the tensor-parallel group: "
                         "it needs --tensor-model-parallel-size > 1")
    micro = None
    if (micro_batch_size is None) != (global_batch_size is None):
        raise ValueError("give both --micro-batch-size and --global-batch-size, or neither")
    if micro_batch_size is not None:
        mbs = positive_int(micro_batch_size, "--micro-batch-size")
        gbs = positive_int(global_batch_size, "--global-batch-size")
        if gbs % (mbs * dp):
            raise ValueError(f"--global-batch-size {gbs} is not divisible by --micro-batch-size "
                             f"{mbs} x data-parallel size {dp} = {mbs * dp}")
        micro = gbs // (mbs * dp)
    return MegatronLayout(world, tp, pp, dp, bool(sequence_parallel), micro)
