"""The planner on the course's own GPT, with the recipe chapter 12's ``train_gpt`` runs: checkable.

:func:`plan_course` measures each rank's peak of one training step on fake tensors under torch's
fake process group (chapter 03's method) with what chapter 12's ranks build: fp32 weights and
Adam, ``"dp"`` torch DDP (``replicate`` beside ``"tp"``), ``"dp_shard"`` FSDP2 per block and at
the root, ``"tp"`` chapter 04's split (``dtensor_block``), ``"pp"`` two stages of one micro-batch.
The peak is read as the ranks read theirs: chapter 01's tracker on the second step.
DDP's C++ reducer cannot take fake tensors: :class:`_DDPStandIn` holds what DDP holds by default
(the gradients plus a flat bucket copy, made again in the second step's forward) and sends what it
sends. :func:`cpu_layout` gives a cluster layout's shape on a few CPU ranks. Measured against
real ranks: docs/modules/plan.md.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh

from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.common.training import make_optimizer
from course_lib.memory.report import categorize, format_bytes
from course_lib.memory.tracker import GlobalMemTracker
from course_lib.plan.recipe import forget_meshes
from course_lib.sharding.fake import fake_process_group
from course_lib.tensor_parallel.layers import dtensor_block

__all__ = ["COURSE_DIMS", "CoursePlan", "plan_course", "cpu_layout", "validate_course_layout"]

#: the mesh dimensions chapter 12 trains the dense GPT on, outermost first (chapter 09's order)
COURSE_DIMS = ("pp", "dp", "dp_replicate", "dp_shard", "tp")


@dataclasses.dataclass
class CoursePlan:
    """:func:`plan_course`'s answer: ``peaks[r]``, rank ``r``'s planned peak in bytes, and the
    categories at that peak (``categories[r]``: params, grads, optimizer, activations...)."""

    layout: dict
    preset: GPTConfig
    batch_size: int
    peaks: list[int]
    categories: list[dict]

    def compare(self, measured: list[int | None]) -> str:
        """A table: per rank the planned and measured peaks and their difference."""
        if len(measured) != len(self.peaks):
            raise ValueError(f"{len(measured)} measured peaks for {len(self.peaks)} ranks")
        lines = [f"{'rank':>4} {'planned':>10} {'measured':>10} {'diff':>7}"]
        for r, (p, m) in enumerate(zip(self.peaks, measured)):
            diff = f"{p / m - 1:+7.1%}" if m else "      -"
            lines.append(f"{r:>4} {format_bytes(p):>10} {format_bytes(m) if m else '-':>10} {diff}")
        return "\n".join(lines)


def validate_course_layout(layout: object, config: GPTConfig, batch_size: int) -> dict:
    """``layout`` as ``{dimension: size}`` (sizes above 1) or a ``ValueError`` saying why."""
    if layout is None:
        layout = {}
    if not isinstance(layout, dict):
        raise ValueError(f"layout must be a dict such as {{'dp_shard': 2, 'tp': 2}}, got {layout!r}")
    for name, size in layout.items():
        if name not in COURSE_DIMS:
            raise ValueError(f"unknown dimension {name!r}; the course GPT's: {COURSE_DIMS}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"layout[{name!r}] must be a positive integer, got {size!r}")
    sizes = {n: layout[n] for n in COURSE_DIMS if layout.get(n, 1) > 1}
    if "dp" in sizes and ("dp_shard" in sizes or "dp_replicate" in sizes):
        raise ValueError("'dp' is torch DDP; with FSDP2's 'dp_shard' name the replicated "
                         "dimension 'dp_replicate' (HSDP)")
    if "dp_replicate" in sizes and "dp_shard" not in sizes:
        raise ValueError("'dp_replicate' is HSDP's replicated dimension beside 'dp_shard'")
    if sizes.get("pp", 1) not in (1, 2) or config.n_layer % sizes.get("pp", 1):
        raise ValueError(f"pp={sizes['pp']}: chapter 12's pipeline has 2 stages, which must "
                         f"split the {config.n_layer} layers")
    if config.n_head % sizes.get("tp", 1):
        raise ValueError(f"tp={sizes['tp']} must divide the {config.n_head} attention heads")
    dp = sizes.get("dp", 1) * sizes.get("dp_replicate", 1) * sizes.get("dp_shard", 1)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size % dp:
        raise ValueError(f"batch_size={batch_size!r} must split evenly over {dp} data-parallel ranks")
    return sizes


class _DDPStandIn(nn.Module):
    """DDP's bytes on fake tensors: each gradient, once accumulated, is copied into its view of a
    flat bucket, all-reduced there and copied back (``gradient_as_bucket_view=False``); the
    bucket is made anew in the forward after the first step, as DDP rebuilds its buckets."""

    def __init__(self, module: nn.Module, group) -> None:
        super().__init__()
        self.module, self.group, self.steps, self.flat = module, group, 0, None
        params = [p for p in module.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in params)
        offsets = dict(zip(params, [0] + list(_cumsum([p.numel() for p in params]))[:-1]))

        def reduce(p: torch.Tensor) -> None:
            view = self.flat[offsets[p]:offsets[p] + p.numel()].view_as(p)
            view.copy_(p.grad)
            dist.all_reduce(view, group=self.group)
            p.grad.copy_(view.div_(dist.get_world_size(self.group)))

        for p in params:
            p.register_post_accumulate_grad_hook(reduce)

    def forward(self, *args, **kwargs):
        if self.steps <= 1:  # built in the first step, rebuilt in the second's forward
            self.flat = None
            self.flat = torch.zeros(self.numel)
        self.steps += 1
        return self.module(*args, **kwargs)


def _cumsum(values):
    total = 0
    for v in values:
        total += v
        yield total


class _Stage(nn.Module):
    """Stage ``stage`` of two (chapter 12's pipeline): embeddings and the first half of the
    blocks, or the second half with the final norm and the head."""

    def __init__(self, gpt: GPT, stage: int) -> None:
        super().__init__()
        self.gpt, self.stage = gpt, stage
        k = gpt.config.n_layer // 2
        gpt.blocks = nn.ModuleList(list(gpt.blocks)[:k] if stage == 0 else list(gpt.blocks)[k:])
        if stage == 0:
            gpt.ln_f, gpt.lm_head = nn.Identity(), nn.Identity()
        else:
            gpt.tok_emb, gpt.pos_emb = nn.Identity(), nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.gpt
        if self.stage == 0:
            x = m.tok_emb(x) + m.pos_emb(torch.arange(x.size(1)))
        for block in m.blocks:
            x = block(x)
        return m.lm_head(m.ln_f(x)) if self.stage == 1 else x


def _wrap(model: nn.Module, blocks, sizes: dict, mesh) -> nn.Module:
    """Chapter 12's data parallelism: DDP over "dp" (FSDP2's replicate beside "tp"), FSDP2 over
    the data-parallel sub-mesh per block and at the root, or nothing."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard
    if "dp" in sizes and "tp" in sizes:
        return replicate(model, mesh=mesh["dp"])
    if "dp" in sizes:
        return _DDPStandIn(model, mesh.get_group("dp"))
    names = tuple(n for n in ("dp_replicate", "dp_shard") if n in sizes)
    if names:
        dp_mesh = mesh[names] if len(names) > 1 else mesh[names[0]]
        for block in blocks:
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model


def _rank_peak(config: GPTConfig, sizes: dict, rank: int, batch: int) -> dict:
    """One rank's categories at the peak of its second step, on fake tensors."""
    world = math.prod(sizes.values())
    pp = sizes.get("pp", 1)
    stage = rank // (world // pp) if pp > 1 else None
    forget_meshes()
    with fake_process_group(rank, world), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = init_device_mesh("cpu", tuple(sizes.values()), mesh_dim_names=tuple(sizes)) \
            if sizes else None
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            torch.manual_seed(0)
            gpt = GPT(config)
            model = gpt if stage is None else _Stage(gpt, stage)
            if "tp" in sizes:  # inside the mode: outside, chapter 04's split makes real shards
                gpt.blocks = nn.ModuleList(dtensor_block(b, config, mesh["tp"]) for b in gpt.blocks)
        # wrapped outside the mode: FSDP2 × TP builds a mesh, which fails on fake tensors
        model = _wrap(model, gpt.blocks, sizes, mesh) if sizes else model
        with mode:
            opt = make_optimizer(model.parameters(), "adam", lr=1e-3, foreach=False)
            x = torch.randint(0, config.vocab_size, (batch, config.seq_len))
            y = torch.randint(0, config.vocab_size, (batch, config.seq_len))
            _train_step(model, opt, config, x, y, stage)  # Adam's moments, DDP's first buckets
            tracker = GlobalMemTracker()
            tracker.track_external(model, opt, x, y)
            with tracker:
                _train_step(model, opt, config, x, y, stage)
            return categorize(tracker.get_tracker_snapshot("peak"))


def _train_step(model, opt, config: GPTConfig, x, y, stage: int | None) -> None:
    """Chapter 12's step: zero the gradients, forward, loss, backward, Adam (a stage: its half,
    with a buffer for what it receives, as the real one's ``recv`` needs)."""
    opt.zero_grad(set_to_none=True)
    if stage is None:
        GPT.loss(model(x), y).backward()
    elif stage == 0:
        h = model(x)
        grad = torch.empty(x.size(0), x.size(1), config.d_model)  # the gradient received
        h.backward(grad)
        torch.empty(())  # the loss received
    else:
        h = torch.empty(x.size(0), x.size(1), config.d_model).requires_grad_()
        GPT.loss(model(h), y).backward()
    opt.step()


def plan_course(layout: dict | None, preset: str | GPTConfig = "small", batch_size: int = 8) -> CoursePlan:
    """Each rank's peak for chapter 12's ``train_gpt(layout, preset=preset,
    batch_size=batch_size)``, measured on fake tensors (one rank per distinct role: a data- or
    tensor-parallel rank holds the same shapes as its peers, a pipeline stage its own)."""
    config = get_config(preset)
    sizes = validate_course_layout(layout, config, batch_size)
    world = math.prod(sizes.values()) if sizes else 1
    dp = sizes.get("dp", 1) * sizes.get("dp_replicate", 1) * sizes.get("dp_shard", 1)
    pp = sizes.get("pp", 1)
    roles = {}
    peaks, cats = [], []
    for rank in range(world):
        role = rank // (world // pp)
        if role not in roles:
            roles[role] = _rank_peak(config, sizes, rank, batch_size // dp)
        cats.append(roles[role])
        peaks.append(sum(roles[role].values()))
    return CoursePlan(dict(sizes), config, batch_size, peaks, cats)


def cpu_layout(candidate, max_ranks: int = 4) -> dict:
    """The same shape as planner layout ``candidate`` on at most ``max_ranks`` CPU ranks, in
    chapter 12's layout form: each dimension the candidate uses kept at size 2 (the pipeline's
    two stages), outermost first, while the product stays within ``max_ranks``; FSDP with
    replicas (HSDP) keeps both; DDP is ``"dp"``. Context and expert parallelism, which the
    course GPT does not run, are dropped (their memory and messages stay the planner's)."""
    wanted = []
    if candidate.pp > 1:
        wanted.append("pp")
    if candidate.dp_replicate > 1 and candidate.dp_shard == 1:
        wanted.append("dp")
    else:
        if candidate.dp_replicate > 1:
            wanted.append("dp_replicate")
        if candidate.dp_shard * candidate.cp > 1:
            wanted.append("dp_shard")
    if candidate.tp > 1:
        wanted.append("tp")
    out: dict = {}
    for name in sorted(wanted, key=lambda n: ("tp", "dp_shard", "pp", "dp", "dp_replicate").index(n)):
        if math.prod(out.values()) * 2 <= max_ranks:
            out[name] = 2
    if "dp_replicate" in out and "dp_shard" not in out:
        out["dp"] = out.pop("dp_replicate")
    return {n: out[n] for n in COURSE_DIMS if n in out}
