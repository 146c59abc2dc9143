"""Before the run: each rank's peak bytes and step time for a layout (the capstone's prediction).

Peak (:func:`predict_peak`): chapter 01's two moments (start and end of backward) on the rank's
share, with its model-state bytes from chapter 09's layouts: dp splits the batch, TP what a
block saves inside attention and the MLP, PP the blocks; FSDP2 adds its gathered root, DDP its
gradient buckets. Gradients in flight inside backward are left out: close to a lower bound.
Step time (:func:`predict_step_time`): the FLOPs split over dp × tp × pp at this CPU's matmul
peak, stretched by chapter 04's bubble, plus :func:`comm_per_step` on chapter 05's α-β model
with α and β fitted once before training, nothing overlapped. A model, not a bound: it leaves
out Adam, LayerNorm, softmax, Python and small matrices' lower matmul rate (which make a CPU
step slower) and overlap (which makes it faster), and its α comes from one fit.
"""
from __future__ import annotations

import torch.distributed as dist

from course_lib.common.dtypes import FP32
from course_lib.common.models import GPTConfig
from course_lib.communication.formulas import AlphaBeta, ring_allreduce_time
from course_lib.composition.layout import Layout
from course_lib.composition.layouts import predict_pp_bytes
from course_lib.memory.predict import activation_terms, batch_bytes
from course_lib.pipeline_parallel.formulas import bubble_formula

__all__ = ["predict_rank", "rank_prediction", "rank_work", "step_time", "slowest",
           "slowest_step", "predict_peak", "root_bytes", "comm_per_step",
           "collective_seconds",
           "predict_step_time", "ddp_buckets", "DDP_BUCKET_BYTES", "DDP_FIRST_BUCKET_BYTES"]

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb = 25
#: DDP's first bucket (the last layers' gradients, ready first) closes at 1 MiB by default
DDP_FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES if dist.is_available() else 2**20


def ddp_buckets(grad_bytes: int) -> int:
    """All-reduces DDP makes per step once it has rebuilt its buckets (from the second step on;
    the first puts every gradient in one): a first bucket of 1 MiB, then 25 MiB ones."""
    return 1 + -(-max(0, grad_bytes - DDP_FIRST_BUCKET_BYTES) // DDP_BUCKET_BYTES)


def root_bytes(config: GPTConfig, stage: int | None = None, pp: int = 1) -> int:
    """fp32 bytes of the parameters outside the blocks that ``stage`` holds: the embeddings on
    the first, the final LayerNorm and the head on the last (FSDP2's root unit)."""
    h, v = config.d_model, config.vocab_size
    first = stage is None or stage == 0
    last = stage is None or stage == pp - 1
    emb = v * h + config.seq_len * h if first else 0
    head = 2 * h + (0 if config.tie_weights and first else v * h) + (v if config.bias else 0)
    return FP32 * (emb + (head if last else 0))


def predict_rank(config: GPTConfig, layout: Layout, batch_size: int, rank: int) -> tuple[dict, int]:
    """Global ``rank``'s predicted model-state bytes (chapter 09's rule for its pipeline stage)
    and its peak (:func:`predict_peak`) for a global batch of ``batch_size`` sequences."""
    states, peak, _ = rank_prediction(config, layout, batch_size, rank, 0.0)
    return states, peak


def rank_prediction(config: GPTConfig, layout: Layout, batch_size: int, rank: int,
                    flops: float) -> tuple[dict, int, tuple]:
    """Everything the layout decides about global ``rank``, once, before the run: its
    model-state bytes, its peak and its :func:`rank_work` for a step of ``flops`` (global batch);
    what the machine adds later (:func:`step_time`) needs no layout."""
    stage = layout.stage_of(rank)
    states = predict_pp_bytes(config, layout, stage)
    work = rank_work(config, layout, batch_size, flops, states)
    return states, predict_peak(config, layout, batch_size, states,
                                stage if layout.pp > 1 else None), work


def predict_peak(config: GPTConfig, layout: Layout, batch_size: int, states: dict,
                 stage: int | None = None) -> int:
    """Predicted peak bytes of one rank's steady training step (fp32, Adam): ``batch_size`` is
    the global batch, ``states`` the rank's predicted ``params``/``grads``/``optimizer``,
    ``stage`` its pipeline stage (``None`` without ``pp``). A stage before the last also holds
    its output and the buffer its gradient comes back in; having no logits, its largest
    backward temporary is the MLP's hidden-layer gradient."""
    tp, pp = layout.tp, layout.pp
    gathered = root_bytes(config, stage, pp) if layout.dp_shard > 1 else 0
    b, s, h = batch_size // layout.dp_size, config.seq_len, config.d_model
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
    buckets = states["grads"] if layout.dp > 1 else 0  # DDP's flat gradient buckets
    fixed = states["params"] + states["optimizer"] + batch_bytes(b, s) + buckets
    return max(fixed + acts + temps + gathered, fixed + states["grads"])


def comm_per_step(config: GPTConfig, layout: Layout, batch_size: int,
                  states: dict) -> list[tuple[str, str, int, int, int]]:
    """One rank's collectives per training step: ``(what, collective, bytes, ranks, calls)``,
    ``bytes`` summed over the ``calls``, each call's whole buffer as nccl-tests counts it."""
    layers = config.n_layer // layout.pp
    bsh = FP32 * (batch_size // layout.dp_size) * config.seq_len * config.d_model
    out = [("the loss's global mean", "all_reduce", FP32, layout.world, 1)]
    if layout.dp > 1:
        out.append(("DDP's gradient buckets", "all_reduce", states["grads"], layout.dp,
                    ddp_buckets(states["grads"])))
    if layout.dp_shard > 1:  # every block: gathered in forward and again in backward; the root
        full, p = states["params"] * layout.dp_shard, layout.dp_shard  # stays gathered
        root = root_bytes(config, 0 if layout.pp > 1 else None, layout.pp)  # pp: stage 0
        out += [("FSDP2's parameter all-gathers", "all_gather", 2 * full - root, p, 2 * layers + 1),
                ("FSDP2's gradient reduce-scatters", "reduce_scatter", full, p, layers + 1)]
    if layout.tp > 1:  # attention and MLP outputs forward, their input gradients backward
        out.append(("TP's block all-reduces", "all_reduce", 4 * layers * bsh, layout.tp,
                    4 * layers))
    if layout.pp > 1:  # forward the activation; back its gradient and the last stage's loss
        out.append(("PP's activation, its gradient and the loss", "send", 2 * bsh + FP32, 2, 3))
    return out


def collective_seconds(link: AlphaBeta, collective: str, n_bytes: float, p: int,
                       calls: int = 1) -> float:
    """Chapter 05's α-β time of ``calls`` collectives moving ``n_bytes`` in all among ``p``
    ranks: a ring all-reduce ``2(p-1)α + 2(p-1)/p·nβ`` per call, half of it for an all-gather
    or a reduce-scatter, ``α + nβ`` for a point-to-point send."""
    if p < 2:
        return 0.0
    ring = calls * ring_allreduce_time(n_bytes / calls, p, link.alpha, link.beta)
    if collective == "all_reduce":
        return ring
    if collective in ("all_gather", "reduce_scatter"):
        return ring / 2
    return calls * link.alpha + n_bytes * link.beta


def rank_work(config: GPTConfig, layout: Layout, batch_size: int, flops: float,
              states: dict) -> tuple[float, float, list]:
    """One rank's share of a step of ``flops`` (global batch), before it runs: its FLOPs
    (split over dp × tp × pp), the stretch of chapter 04's bubble (one micro-batch: the stages
    take turns) and its :func:`comm_per_step`. :func:`step_time` turns it into seconds."""
    share = flops / (layout.dp_size * layout.tp * layout.pp)
    return share, 1 - bubble_formula(layout.pp, 1), comm_per_step(config, layout, batch_size,
                                                                 states)


def step_time(work: tuple[float, float, list], matmul_peak: float,
              link: AlphaBeta | None) -> dict[str, float]:
    """``compute_s`` + ``comm_s`` = ``step_s`` of one rank's :func:`rank_work` at ``matmul_peak``
    (FLOP/s of one rank) and ``link`` (α, β; ``None``: one process, no communication)."""
    share, busy, comm = work
    compute = share / matmul_peak / busy
    seconds = 0.0 if link is None else sum(collective_seconds(link, c, n, p, k)
                                           for _, c, n, p, k in comm)
    return {"compute_s": compute, "comm_s": seconds, "step_s": compute + seconds}


def predict_step_time(config: GPTConfig, layout: Layout, batch_size: int,
                      flops: float, states: dict, matmul_peak: float,
                      link: AlphaBeta | None) -> dict[str, float]:
    """``compute_s`` + ``comm_s`` = ``step_s`` for one rank, before it runs: ``flops`` of the
    step on the global batch, ``matmul_peak`` (FLOP/s of one rank), ``link`` (α, β; ``None``:
    one process, no communication)."""
    return step_time(rank_work(config, layout, batch_size, flops, states), matmul_peak, link)


def slowest(works: list[tuple], constants: dict) -> dict[str, float]:
    """The slowest of the ranks' :func:`rank_work` at this machine's ``constants``
    (``matmul_peak``; ``link``: α, β, or ``None`` alone): no layout needed any more."""
    link = AlphaBeta(*constants["link"]) if constants.get("link") else None
    return max((step_time(w, constants["matmul_peak"], link) for w in works),
               key=lambda t: t["step_s"])


def slowest_step(config: GPTConfig, layout: Layout, batch_size: int, flops: float,
                 ranks: list[dict], constants: dict) -> dict[str, float]:
    """The slowest rank's :func:`predict_step_time` with this machine's ``constants``
    (``matmul_peak``; ``link``: α, β, or ``None`` alone); ``ranks``: each rank's states."""
    return slowest([rank_work(config, layout, batch_size, flops, b) for b in ranks], constants)
