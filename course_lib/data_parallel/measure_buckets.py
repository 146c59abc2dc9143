"""The harness of :mod:`course_lib.data_parallel.buckets`: DDP by hand against torch's DDP.

:func:`compare_by_hand` trains :class:`~course_lib.data_parallel.buckets.DDPByHand` (or the
notebook's class, shipped by value) and torch's ``DistributedDataParallel`` side by side on real
ranks, on the course GPT changed the way a systems course's tests change a model
(:data:`SCENARIOS`: tied weights, a frozen parameter, AdamW with weight decay, two micro-batches
under ``no_sync``, bf16 parameters, one bucket per tensor), several scenarios per launch. The
plain scenario is also compared with one process, and logs when each bucket was launched,
counted in gradients produced so far — read from outside by a second hook on every parameter,
which autograd runs after the wrapper's: a count, the same on every machine. A parameter that
gets no gradient must raise an error naming it (:attr:`ByHandComparison.unused_error`).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.checks import positive_int
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, get_config
from course_lib.data_parallel.buckets import DDPByHand
from course_lib.data_parallel.measure import TOLERANCE, _params, max_diff, train_single, validate_dp_run
from course_lib.launcher.launch import run

__all__ = ["DEFAULT_CAP_BYTES", "SCENARIOS", "SCENARIO_TOLERANCE", "within", "ByHandComparison",
           "compare_by_hand"]

#: 160 KiB: the tiny GPT's 535 KiB of fp32 gradients make two full buckets and a smaller last
#: one (DDP's default cap is 25 MiB).
DEFAULT_CAP_BYTES = 160 * 2 ** 10

#: scenario -> how the tiny GPT and its training differ from the plain run (SGD, fp32, untied)
SCENARIOS: dict[str, dict] = {
    "plain": {},
    "tied weights": {"tie": True},
    "a frozen parameter": {"frozen": "pos_emb.weight"},
    "AdamW, weight decay 0.1": {"adamw": True},
    "2 micro-batches, no_sync": {"micro": 2},
    "bf16 parameters": {"dtype": torch.bfloat16},
    "one bucket per tensor": {"per_tensor": True},
}

#: hand vs torch DDP, per scenario: ``|hand - torch| <= atol + rtol·|torch|`` for every element.
#: At 2 ranks the two are bit-identical; at 4, gloo adds each element of DDP's buckets (one big
#: bucket in its first step) in another order than ours: 1 ulp per gradient. fp32 SGD: see
#: :data:`TOLERANCE`. AdamW (lr 1e-2, eps 1e-8) steps by lr·m/(√v+eps): where the ranks' gradients
#: cancel to ~eps, one ulp of them (~1e-9) changes that step by lr·ulp/eps, up to 1e-3 (seen at 4
#: ranks: 9e-5 after 3 steps); atol 3e-3. bf16: a gradient's ulp (2^-8·|g|, |g| < 0.13)
#: moves an SGD step (lr 0.1) by 5e-5, a weight's own rounding by one of its ulps (rtol 2^-7);
#: atol 1e-3 for 3 steps (seen: 1.2e-4 beyond rtol). A real mistake moves weights by 1e-2 or more.
SCENARIO_TOLERANCE = {name: TOLERANCE for name in SCENARIOS} | {
    "AdamW, weight decay 0.1": {"rtol": 0.0, "atol": 3e-3},
    "bf16 parameters": {"rtol": 2 ** -7, "atol": 1e-3}}


def within(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tolerance: dict) -> bool:
    """Every tensor of ``a`` within ``tolerance`` (rtol, atol) of ``b``'s, the same names."""
    return a.keys() == b.keys() and all(
        torch.allclose(a[k].double(), b[k].double(), **tolerance) for k in a)


def _model(spec: dict, seed: int, unused: bool = False) -> nn.Module:
    torch.manual_seed(seed + dist.get_rank())   # different on purpose: the broadcast fixes it
    model = GPT(get_config("tiny").replace(tie_weights=spec.get("tie", False)))
    model.register_buffer("scale", torch.rand(4))                  # a buffer, broadcast too
    if "frozen" in spec:
        model.get_parameter(spec["frozen"]).requires_grad_(False)
    if unused:
        model.unused = nn.Linear(4, 4)                            # never called in forward
    return model.to(spec.get("dtype", torch.float32))


class _LaunchLog:
    """Per optimizer step: (bucket, gradients produced so far) each time ``launched`` grew."""

    def __init__(self, hand: nn.Module) -> None:
        self.hand, self.steps, self.produced, self.dtypes = hand, [], 0, set()
        for p in hand.module.parameters():
            if p.requires_grad:                         # after the wrapper's hook: sees its launch
                p.register_post_accumulate_grad_hook(self._seen)

    def start(self) -> None:
        self.steps.append([])
        self.produced = 0

    def _seen(self, param: torch.Tensor) -> None:
        self.produced += 1
        launched, log = self.hand.launched, self.steps[-1]
        while len(log) < len(launched):
            bucket, flat, _ = launched[len(log)]
            log.append((bucket, self.produced))
            self.dtypes.add(str(flat.dtype).removeprefix("torch."))


def _train(model: nn.Module, spec: dict, steps: int, local_batch: int, seq_len: int, seed: int,
           log: _LaunchLog | None = None) -> None:
    """Train ``model`` (DDP by hand when ``log`` is given, else torch's DDP) as ``spec`` says."""
    rank, world, micro = dist.get_rank(), dist.get_world_size(), spec.get("micro", 1)
    optimizer = (torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
                 if spec.get("adamw") else torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(steps):
        inputs, targets = get_batch(local_batch * micro, seq_len, seed=seed, step=step,
                                    rank=rank, world_size=world)
        optimizer.zero_grad(set_to_none=True)
        if log is not None:
            log.start()
        for m in range(micro):                  # all but the last micro-batch under no_sync()
            rows = slice(m * local_batch, (m + 1) * local_batch)
            with model.no_sync() if m < micro - 1 else nullcontext():
                (GPT.loss(model(inputs[rows]), targets[rows]) / micro).backward()
        if log is not None:
            model.finish_gradient_synchronization()
        optimizer.step()


def _unused_error(ddp_class: type, seed: int) -> str | None:
    """What ``finish_gradient_synchronization`` says about a parameter forward never used."""
    hand = ddp_class(_model({}, seed, unused=True), bucket_cap_mb=DEFAULT_CAP_BYTES / 2 ** 20)
    inputs, targets = get_batch(2, 16, seed=seed, rank=dist.get_rank(),
                                world_size=dist.get_world_size())
    GPT.loss(hand(inputs), targets).backward()
    try:
        hand.finish_gradient_synchronization()
    except RuntimeError as error:
        return str(error)
    return None


def _layout(buckets) -> list[tuple[int, int]]:
    return [(len(b), sum(p.numel() * p.element_size() for p in b)) for b in buckets]


def _by_hand_rank(ddp_class: type, names: list[str], steps: int, local_batch: int,
                  seq_len: int, seed: int, cap_bytes: int) -> dict:
    """On each rank: every scenario by hand, then with torch's DDP; the unused-parameter case."""
    out = {}
    for name in names:
        spec = SCENARIOS[name]
        cap_mb = None if spec.get("per_tensor") else cap_bytes / 2 ** 20
        hand = ddp_class(_model(spec, seed), bucket_cap_mb=cap_mb)
        log = _LaunchLog(hand)
        _train(hand, spec, steps, local_batch, seq_len, seed, log)
        reference = DDP(_model(spec, seed), bucket_cap_mb=cap_mb or 2 ** -30)  # 1 B: per tensor
        _train(reference, spec, steps, local_batch, seq_len, seed)
        out[name] = {"hand": _params(hand), "torch": _params(reference), "layout":
                     _layout(hand.buckets), "launches": log.steps[-1],
                     "per_step": [len(s) for s in log.steps], "dtypes": sorted(log.dtypes),
                     "param_dtypes": sorted({str(p.dtype).removeprefix("torch.")
                                             for p in hand.parameters()})}
    out["unused_error"] = _unused_error(ddp_class, seed)
    if dist.get_rank() == 0 and "plain" in names:   # same seed as rank 0: same initial weights
        out["single"] = train_single(steps, local_batch * dist.get_world_size(), seq_len,
                                     seed=seed)[0]
    return out


@dataclass(frozen=True)
class ByHandComparison:
    """DDP by hand vs torch's DDP per scenario, rank 0 (max abs differences of params, buffers)."""

    world: int
    steps: int
    cap_bytes: int
    vs_torch: dict[str, float]        # scenario -> max |hand - torch DDP|
    equal: dict[str, bool]            # scenario -> within SCENARIO_TOLERANCE of torch DDP
    ranks_spread: float               # max over scenarios and ranks of |rank r - rank 0| (hand)
    hand_vs_single: float | None      # plain scenario: hand vs one process on the global batch
    torch_vs_single: float | None
    per_step: dict[str, list[int]]    # scenario -> all-reduces launched in each optimizer step
    dtypes: dict[str, tuple[list[str], list[str]]]   # scenario -> (buckets', parameters' dtypes)
    launches: list[tuple[int, int]]   # plain, last step: (bucket, gradients produced by then)
    buckets: list[tuple[int, int]]    # (tensors, bytes) of each bucket of the plain model
    n_grads: int                      # gradients one backward of the plain model produces
    unused_error: str | None          # what finish said about a parameter without gradient


def compare_by_hand(ddp_class: type = DDPByHand, world: int = 2,
                    scenarios: tuple[str, ...] = tuple(SCENARIOS), steps: int = 3,
                    local_batch: int = 4, seq_len: int = 32, *,
                    cap_bytes: int = DEFAULT_CAP_BYTES, seed: int = 0) -> ByHandComparison:
    """Train ``ddp_class(model, bucket_cap_mb=...)`` and torch's DDP per scenario; compare."""
    validate_dp_run(world, "tiny", steps=steps, local_batch=local_batch, seq_len=seq_len)
    if not isinstance(ddp_class, type):
        raise TypeError(f"pass the class itself (DDPByHand, no parentheses), got "
                        f"{type(ddp_class).__name__}")
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        raise ValueError(f"scenarios must be among {list(SCENARIOS)}, got {list(scenarios)}")
    positive_int(cap_bytes, "cap_bytes")
    ranks = run(_by_hand_rank, world, ddp_class, list(scenarios), steps, local_batch, seq_len,
                seed, cap_bytes, device="cpu", threads=1)
    first, names = ranks[0], list(scenarios)
    plain, single = first.get("plain"), first.get("single")

    def vs_single(mode: str) -> float | None:
        return max_diff({k: plain[mode][k] for k in single}, single) if single else None

    return ByHandComparison(
        world, steps, cap_bytes, {n: max_diff(first[n]["hand"], first[n]["torch"]) for n in names},
        {n: all(within(r[n]["hand"], r[n]["torch"], SCENARIO_TOLERANCE[n]) for r in ranks)
         for n in names},
        max(max_diff(r[n]["hand"], first[n]["hand"]) for r in ranks for n in names),
        vs_single("hand"), vs_single("torch"), {n: first[n]["per_step"] for n in names},
        {n: (first[n]["dtypes"], first[n]["param_dtypes"]) for n in names},
        plain["launches"] if plain else [], plain["layout"] if plain else [],
        sum(t for t, _ in plain["layout"]) if plain else 0, first["unused_error"])
