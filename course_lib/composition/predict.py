"""Before the run: each rank's peak bytes and step time for a layout (the capstone's prediction).

:func:`rank_prediction` reads the layout once, top down: the rank's stage and model-state bytes
(chapter 09's layouts: TP's shapes, FSDP-sharded over ``dp_shard``), then plain numbers go to
the earlier chapters' formulas: DDP's bucket count (02), the peak (01's two moments on the
rank's part, :func:`~course_lib.memory.predict.part_peak_bytes`), the bubble (04). Step time
(:func:`step_time`): the FLOPs split over dp × tp × pp at this CPU's matmul peak, stretched by
the bubble, plus the rank's collectives on chapter 05's α-β model with α and β fitted once
before training, nothing overlapped. A model, not a bound: it leaves out Adam, LayerNorm,
softmax, Python and small matrices' lower matmul rate (which make a CPU step slower) and overlap
(which makes it faster), and its α comes from one fit.
"""
from __future__ import annotations

from course_lib.common.deprecation import renamed
from course_lib.common.dtypes import FP32
from course_lib.common.models import GPTConfig
from course_lib.communication.formulas import AlphaBeta, ring_allreduce_time
from course_lib.composition.layout import Layout
from course_lib.composition.layouts import predict_pp_bytes
from course_lib.data_parallel.buckets import ddp_buckets
from course_lib.memory.predict import part_peak_bytes, root_bytes
from course_lib.pipeline_parallel.formulas import bubble_formula

__all__ = ["predict_rank", "rank_prediction", "rank_work", "step_time", "slowest",
           "slowest_step", "predict_peak", "root_bytes", "comm_per_step", "collective_seconds",
           "predict_step_time", "ddp_buckets"]
__getattr__ = renamed(__name__, {f"DDP_{n}BUCKET_BYTES": f"course_lib.data_parallel.buckets."
                                 f"DDP_{n}BUCKET_BYTES" for n in ("", "FIRST_")})  # issue 51


def predict_rank(config: GPTConfig, layout: Layout, batch_size: int, rank: int) -> tuple[dict, int]:
    """Global ``rank``'s predicted model-state bytes (chapter 09's rule for its pipeline stage)
    and its peak (:func:`predict_peak`) for a global batch of ``batch_size`` sequences."""
    return rank_prediction(config, layout, batch_size, rank, 0.0)[:2]


def rank_prediction(config: GPTConfig, layout: Layout, batch_size: int, rank: int,
                    flops: float, states: dict | None = None) -> tuple[dict, int, tuple]:
    """Everything the layout decides about global ``rank``, once, before the run: its
    model-state bytes (``states``, unless given), its peak and its :func:`rank_work` for a step
    of ``flops`` (global batch); what the machine adds later (:func:`step_time`) needs no layout.
    Collectives: ``(what, collective, bytes, ranks, calls)``, ``bytes`` summed over the
    ``calls``, each call's whole buffer as nccl-tests counts it."""
    stage, pp = layout.stage_of(rank), layout.pp
    states = predict_pp_bytes(config, layout, stage) if states is None else states
    layers, b = config.n_layer // pp, batch_size // layout.dp_size
    bsh = FP32 * b * config.seq_len * config.d_model
    comm = [("the loss's global mean", "all_reduce", FP32, layout.world, 1)]
    if layout.dp > 1:
        comm.append(("DDP's gradient buckets", "all_reduce", states["grads"], layout.dp,
                     ddp_buckets(states["grads"])))
    gathered = root_bytes(config, stage, pp) if layout.dp_shard > 1 else 0  # FSDP2's root
    if layout.dp_shard > 1:  # each block gathered in forward and in backward, the root once
        full, p, root = states["params"] * layout.dp_shard, layout.dp_shard, gathered
        comm += [("FSDP2's parameter all-gathers", "all_gather", 2 * full - root, p, 2 * layers + 1),
                 ("FSDP2's gradient reduce-scatters", "reduce_scatter", full, p, layers + 1)]
    if layout.tp > 1:  # attention and MLP outputs forward, their input gradients backward
        comm.append(("TP's block all-reduces", "all_reduce", 4 * layers * bsh, layout.tp, 4 * layers))
    if pp > 1:  # forward the activation; back its gradient and the last stage's loss
        comm.append(("PP's activation, its gradient and the loss", "send", 2 * bsh + FP32, 2, 3))
    peak = part_peak_bytes(config, b, states, tp=layout.tp, blocks=layers, first=stage == 0,
                           last=stage == pp - 1, extra=gathered, kept_grads=layout.dp > 1)
    return states, peak, (flops / (layout.dp_size * layout.tp * pp), 1 - bubble_formula(pp, 1), comm)


def predict_peak(config: GPTConfig, layout: Layout, batch_size: int, states: dict,
                 stage: int | None = None) -> int:
    """Predicted peak bytes of one rank's steady training step (fp32, Adam): ``batch_size`` is
    the global batch, ``states`` the rank's predicted ``params``/``grads``/``optimizer``,
    ``stage`` its pipeline stage (``None`` without ``pp``); see :func:`rank_prediction`."""
    rank = next(r for r in range(layout.world) if layout.stage_of(r) == (stage or 0))
    return rank_prediction(config, layout, batch_size, rank, 0.0, states)[1]


def comm_per_step(config: GPTConfig, layout: Layout, batch_size: int, states: dict,
                  rank: int = 0) -> list[tuple[str, str, int, int, int]]:
    """Global ``rank``'s collectives per training step (:func:`rank_prediction`'s) for its
    ``states``."""
    return rank_work(config, layout, batch_size, 0.0, states, rank)[2]


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
              states: dict, rank: int = 0) -> tuple[float, float, list]:
    """Global ``rank``'s share of a step of ``flops`` (global batch), before it runs: its FLOPs
    (split over dp × tp × pp), the stretch of chapter 04's bubble (one micro-batch: the stages
    take turns) and its :func:`comm_per_step`. :func:`step_time` turns it into seconds."""
    return rank_prediction(config, layout, batch_size, rank, flops, states)[2]


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
    """:func:`step_time` of the rank's :func:`rank_work`, before it runs."""
    return step_time(rank_work(config, layout, batch_size, flops, states), matmul_peak, link)


def slowest(works: list[tuple], constants: dict) -> dict[str, float]:
    """The slowest of the ranks' :func:`rank_work` at this machine's ``constants``
    (``matmul_peak``; ``link``: α, β, or ``None`` alone): no layout needed any more."""
    link = AlphaBeta(*constants["link"]) if constants.get("link") else None
    return max((step_time(w, constants["matmul_peak"], link) for w in works),
               key=lambda t: t["step_s"])


def slowest_step(config: GPTConfig, layout: Layout, batch_size: int, flops: float,
                 ranks: list[dict], constants: dict) -> dict[str, float]:
    """:func:`slowest` of the :func:`rank_work` of ``ranks`` (global rank r's states at r)."""
    return slowest([rank_work(config, layout, batch_size, flops, b, r) for r, b in enumerate(ranks)],
                   constants)
