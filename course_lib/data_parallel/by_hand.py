"""Data parallelism by hand, then with torch's ``DistributedDataParallel`` (chapter 2).

This module *is* the lesson of ``02_data_parallel``; read it top to bottom. Data parallelism
(DP) keeps a full copy of the model on every rank and splits the **batch**:

1. **same start** — every rank builds the model; rank 0's weights are broadcast to all
   (:func:`broadcast_parameters`). Here ranks are even seeded differently on purpose, so a
   forgotten broadcast shows up at once;
2. **own data** — rank ``r`` takes rows ``r·b … (r+1)·b-1`` of the global batch of ``N·b`` rows
   (:func:`course_lib.common.data.get_batch` with ``rank``/``world_size``); forward and backward run on
   that shard alone, so each rank holds the gradient of *its* mean loss;
3. **same gradient** — an ``all_reduce(SUM)`` and a division by ``N`` turn the ``N`` local
   gradients into their mean (:func:`average_gradients`). The mean of ``N`` equal-sized shard
   means is the mean over the whole global batch: every rank now holds exactly the gradient one
   process would compute on all ``N·b`` rows;
4. **same step** — identical weights + identical gradient + identical optimizer = identical
   new weights. No further communication is needed, and the ranks never drift apart.

:func:`compare_ddp` checks it: after ``k`` SGD steps the hand-written version, torch's
``DistributedDataParallel`` (which does 1-4 for you, with bucketing and overlap — see
:mod:`course_lib.data_parallel.ddp_internals`) and a single process on the concatenated batch agree.
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
from course_lib.common.models import GPT, get_config
from course_lib.launcher import devices
from course_lib.launcher.launch import run

__all__ = ["broadcast_parameters", "average_gradients", "train_steps", "train_single",
           "train_rank", "DDPComparison", "compare_ddp", "max_diff", "TOLERANCE"]

Batch = tuple[torch.Tensor, torch.Tensor]

#: assert_close tolerance for "DP equals one process" in fp32 after a few SGD steps. Float
#: addition is not associative: one process sums the per-token losses of all N·b rows at once,
#: DP sums N partial means (gloo's all-reduce in its own order). Each gradient element then
#: differs by a few ulp (fp32 eps = 1.2e-7, relative), and an SGD step with lr 0.1 moves weights
#: by ~1e-3, so after k steps weights may differ by ~k·lr·|g|·1e-6 ≈ 1e-9…1e-7. atol=1e-6 sits
#: 10x above that and 100x below the smallest real mistake (forgetting to divide by N moves
#: weights by lr·|g|·(N−1) ≈ 1e-4 or more; see ``ddp_check.what_breaks``).
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Step 1: copy rank ``src``'s parameters and buffers to every rank (in place)."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=src)


def average_gradients(model: nn.Module) -> None:
    """Step 3: replace every rank's gradients with their mean over all ranks (in place)."""
    world = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)   # every rank: g_0 + ... + g_{N-1}
            param.grad /= world                                 # ... / N = the global mean


def train_steps(model: nn.Module, batch_of_step: Callable[[int], Batch], steps: int, *,
                lr: float = 0.1, sync: Callable[[nn.Module], None] | None = None) -> list[float]:
    """The one training loop of the chapter: SGD on ``batch_of_step(step)`` for ``steps`` steps.

    ``sync(model)`` runs between backward and the optimizer step — :func:`average_gradients` for
    DP by hand, ``None`` for one process or for a DDP-wrapped model (which syncs inside
    backward). Returns each step's loss (this rank's local loss).
    """
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


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    model = model.module if isinstance(model, DDP) else model
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_single(steps: int = 3, global_batch: int = 8, seq_len: int = 32, *, lr: float = 0.1,
                 seed: int = 0, preset: str = "tiny"
                 ) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The reference: one process trains on the whole global batch. ``(params, losses)``."""
    torch.manual_seed(seed)
    model = GPT(get_config(preset))
    losses = train_steps(model, lambda step: get_batch(global_batch, seq_len, seed=seed, step=step),
                         steps, lr=lr)
    return _params(model), losses


def train_rank(mode: str, steps: int, local_batch: int, seq_len: int, lr: float, seed: int,
               preset: str, sync: Callable[[nn.Module], None] | None = None,
               shard: bool = True, broadcast: Callable[[nn.Module], None] | None = None
               ) -> tuple[dict[str, torch.Tensor], list[float]]:
    """On one rank: train with DP ``"hand"`` (steps 1-4 above) or ``"torch"`` (DDP).

    ``sync`` and ``broadcast`` replace :func:`average_gradients` and
    :func:`broadcast_parameters` in hand mode (the notebook passes its own cells' functions),
    and ``shard=False`` gives every rank rank 0's rows: the exercise and the mistakes of
    :mod:`course_lib.data_parallel.mistakes`. Returns this rank's final parameters and losses.
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


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two parameter dicts with the same names."""
    if a.keys() != b.keys():
        raise ValueError("the two models have different parameter names")
    return max((a[k] - b[k]).abs().max().item() for k in a)


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
        return (f"world {self.world}, {self.steps} SGD steps, max |difference| of the weights:\n"
                f"  hand DP   vs one process : {self.hand_vs_single:.1e}\n"
                f"  torch DDP vs one process : {self.torch_vs_single:.1e}\n"
                f"  hand DP   vs torch DDP   : {self.hand_vs_torch:.1e}\n"
                f"  between ranks            : {self.ranks_spread:.1e}")


def _both_modes(steps: int, local_batch: int, seq_len: int, lr: float, seed: int, preset: str,
                sync=None, broadcast=None):
    """On each rank: hand DP, then torch DDP; rank 0 also trains the one-process reference."""
    out = {mode: train_rank(mode, steps, local_batch, seq_len, lr, seed, preset, sync=sync,
                            broadcast=broadcast) for mode in ("hand", "torch")}
    if dist.get_rank() == 0:
        out["single"] = train_single(steps, local_batch * dist.get_world_size(), seq_len, lr=lr,
                                     seed=seed, preset=preset)
    return out


def _validate(world: int, steps: int, local_batch: int, seq_len: int, preset: str) -> None:
    devices.plan(world)
    for name, value in (("steps", steps), ("local_batch", local_batch), ("seq_len", seq_len)):
        positive_int(value, f"{name}")
    if seq_len > get_config(preset).seq_len:
        raise ValueError(f"seq_len={seq_len} exceeds preset {preset!r}'s "
                         f"seq_len={get_config(preset).seq_len}")


def compare_ddp(world: int = 2, steps: int = 3, local_batch: int = 4, seq_len: int = 32, *,
                lr: float = 0.1, seed: int = 0, preset: str = "tiny", check: bool = False,
                sync: Callable[[nn.Module], None] | None = None,
                broadcast: Callable[[nn.Module], None] | None = None) -> DDPComparison:
    """Train hand DP and torch DDP on ``world`` ranks and one process on the global batch.

    ``sync`` / ``broadcast`` (default :func:`average_gradients` / :func:`broadcast_parameters`)
    are the hand version's steps 3 and 1: the notebook passes the functions typed in its cell.
    With ``check=True`` it also asserts (``torch.testing.assert_close`` with :data:`TOLERANCE`)
    that both equal the single process and that all ranks hold identical parameters.
    """
    _validate(world, steps, local_batch, seq_len, preset)
    # CPU + gloo even where GPUs exist: the lesson is the arithmetic, not the device.
    # threads=1: one core per rank, the CPU analogue of one GPU per rank (and no idle threads
    # spinning on a busy machine)
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
