"""Chapter 2's harness: the lessons trained on real ranks next to torch's DDP and one process.

* :func:`compare_ddp` — DP by hand (:mod:`course_lib.data_parallel.by_hand`, or the notebook's
  own functions), torch's ``DistributedDataParallel`` and one process on the concatenated batch,
  after the same SGD steps (:func:`train_rank_dp`, :func:`train_single`);
* :mod:`course_lib.data_parallel.measure_buckets` does the same for
  :class:`~course_lib.data_parallel.buckets.DDPByHand` (this file would pass 300 lines).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.common.checks import positive_int
from course_lib.common.data import get_batch
from course_lib.common.deprecation import renamed
from course_lib.common.models import GPT, get_config
from course_lib.data_parallel.by_hand import average_gradients, broadcast_parameters
from course_lib.launcher import devices
from course_lib.launcher.launch import run

__all__ = ["TOLERANCE", "max_diff", "train_steps", "train_single", "train_rank_dp",
           "DDPComparison", "compare_ddp", "validate_dp_run"]

Batch = tuple[torch.Tensor, torch.Tensor]

#: assert_close tolerance for "DP equals one process" in fp32 after a few SGD steps. One process
#: sums the per-token losses of all N·b rows at once, DP sums N partial means (gloo in its own
#: order): a few ulp per gradient element (fp32 eps 1.2e-7), weights ~1e-9…1e-7 apart after k
#: steps of lr 0.1. atol=1e-6 sits 10x above that and 100x below the smallest real mistake
#: (forgetting to divide by N moves weights by 1e-4 or more; see ``mistakes.what_breaks``).
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two tensor dicts with the same names."""
    if a.keys() != b.keys():
        raise ValueError("the two models have different parameter names")
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    inner = getattr(model, "module", None)        # a wrapper (DDP, DDPByHand, a cell's class)
    model = inner if isinstance(inner, nn.Module) else model
    return {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}


def train_steps(model: nn.Module, batch_of_step: Callable[[int], Batch], steps: int, *,
                lr: float = 0.1, sync: Callable[[nn.Module], None] | None = None) -> list[float]:
    """The chapter's loop: SGD on ``batch_of_step(step)``; ``sync(model)`` between backward and
    step (None for one process or a DDP-wrapped model). Returns this rank's losses."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        inputs, targets = batch_of_step(step)
        optimizer.zero_grad(set_to_none=True)
        loss = GPT.loss(model(inputs), targets)
        loss.backward()
        if sync is not None:
            sync(model)
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_single(steps: int = 3, global_batch: int = 8, seq_len: int = 32, *, lr: float = 0.1,
                 seed: int = 0, preset: str = "tiny"
                 ) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The reference: one process trains on the whole global batch. ``(params, losses)``."""
    torch.manual_seed(seed)
    model = GPT(get_config(preset))
    losses = train_steps(model, lambda step: get_batch(global_batch, seq_len, seed=seed, step=step),
                         steps, lr=lr)
    return _params(model), losses


def train_rank_dp(mode: str, steps: int, local_batch: int, seq_len: int, lr: float, seed: int,
                  preset: str, sync: Callable[[nn.Module], None] | None = None,
                  shard: bool = True, broadcast: Callable[[nn.Module], None] | None = None
                  ) -> tuple[dict[str, torch.Tensor], list[float]]:
    """On one rank: train with DP ``"hand"`` (the four steps of ``by_hand``) or ``"torch"`` (DDP).

    ``sync``/``broadcast`` replace ``average_gradients``/``broadcast_parameters`` in hand mode
    (the notebook passes its cell's functions); ``shard=False`` gives every rank rank 0's rows
    (a mistake of ``mistakes``). Returns this rank's final parameters and losses.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank)            # different on purpose: the broadcast must fix it
    model: nn.Module = GPT(get_config(preset))
    if mode == "hand":
        (broadcast or broadcast_parameters)(model)   # 1. same start
        sync = sync or average_gradients      # 3. same gradient (after backward)
    elif mode == "torch":
        model, sync = DDP(model), None        # broadcasts in its constructor, averages in backward
    else:
        raise ValueError(f"mode must be 'hand' or 'torch', got {mode!r}")

    def my_shard(step: int) -> Batch:        # 2. own data: this rank's rows of the global batch
        return get_batch(local_batch, seq_len, seed=seed, step=step, rank=rank if shard else 0,
                         world_size=world)

    losses = train_steps(model, my_shard, steps, lr=lr, sync=sync)   # 4. same step
    return _params(model), losses


__getattr__ = renamed(__name__, {"train_rank": "train_rank_dp"})  # before issue 32


@dataclass(frozen=True)
class DDPComparison:
    """Hand DP, torch DDP and one process after the same steps (max abs differences)."""

    world: int
    steps: int
    hand_vs_single: float
    torch_vs_single: float
    hand_vs_torch: float
    ranks_spread: float          # largest difference between any rank and rank 0 (both modes)
    global_losses: list[float]   # mean of the ranks' local losses, hand mode, per step
    single_losses: list[float]

    def __str__(self) -> str:
        rows = (("hand DP   vs one process", self.hand_vs_single),
                ("torch DDP vs one process", self.torch_vs_single),
                ("hand DP   vs torch DDP  ", self.hand_vs_torch),
                ("between ranks           ", self.ranks_spread))
        return (f"world {self.world}, {self.steps} SGD steps, max |difference| of the weights:\n"
                + "\n".join(f"  {label} : {value:.1e}" for label, value in rows))


def _both_modes(steps, local_batch, seq_len, lr, seed, preset, sync=None, broadcast=None):
    """On each rank: hand DP, then torch DDP; rank 0 also trains the one-process reference."""
    out = {mode: train_rank_dp(mode, steps, local_batch, seq_len, lr, seed, preset, sync=sync,
                            broadcast=broadcast) for mode in ("hand", "torch")}
    if dist.get_rank() == 0:
        out["single"] = train_single(steps, local_batch * dist.get_world_size(), seq_len, lr=lr,
                                     seed=seed, preset=preset)
    return out


def validate_dp_run(world: int, preset: str, **counts: int) -> None:
    """Raise ``ValueError`` before any rank starts: a world this machine cannot place, a count
    below 1, or a ``seq_len`` longer than the preset's."""
    devices.place(world)
    for name, value in counts.items():
        positive_int(value, name)
    if counts.get("seq_len", 0) > get_config(preset).seq_len:
        raise ValueError(f"seq_len={counts['seq_len']} exceeds preset {preset!r}'s "
                         f"seq_len={get_config(preset).seq_len}")


def compare_ddp(world: int = 2, steps: int = 3, local_batch: int = 4, seq_len: int = 32, *,
                lr: float = 0.1, seed: int = 0, preset: str = "tiny", check: bool = False,
                sync: Callable[[nn.Module], None] | None = None,
                broadcast: Callable[[nn.Module], None] | None = None) -> DDPComparison:
    """Train hand DP and torch DDP on ``world`` ranks and one process on the global batch.

    ``sync``/``broadcast`` are the hand version's steps 3 and 1 (the notebook's cell). With
    ``check=True`` it also asserts (:data:`TOLERANCE`) that both equal one process and that all
    ranks hold bit-identical parameters.
    """
    validate_dp_run(world, preset, steps=steps, local_batch=local_batch, seq_len=seq_len)
    # CPU + gloo even where GPUs exist (the lesson is the arithmetic); one core per rank
    per_rank = run(_both_modes, world, steps, local_batch, seq_len, lr, seed, preset, sync,
                   broadcast, device="cpu", threads=1)
    single, single_losses = per_rank[0]["single"]
    hand, torch_ddp = per_rank[0]["hand"][0], per_rank[0]["torch"][0]
    spread = max(max_diff(r[mode][0], per_rank[0][mode][0]) for r in per_rank
                 for mode in ("hand", "torch"))
    if check:
        for name, params in (("hand DP", hand), ("torch DDP", torch_ddp)):
            torch.testing.assert_close(params, single, **TOLERANCE,
                                       msg=lambda m, n=name: f"{n} differs from one process: {m}")
        for r, result in enumerate(per_rank):
            for mode in ("hand", "torch"):  # DP keeps replicas *bit*-identical: same ops, same data
                torch.testing.assert_close(result[mode][0], per_rank[0][mode][0], rtol=0, atol=0,
                                           msg=lambda m, r=r: f"rank {r} differs from rank 0: {m}")
    losses = [sum(r["hand"][1][s] for r in per_rank) / world for s in range(steps)]
    return DDPComparison(world, steps, max_diff(hand, single), max_diff(torch_ddp, single),
                         max_diff(hand, torch_ddp), spread, losses, single_losses)
