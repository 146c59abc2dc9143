"""Out of memory on one rank: a per-rank memory budget enforced by chapter 01's tracker.

``BudgetTracker`` is chapter 01's ``MemTracker`` (it sees every tensor storage as it is created)
that raises :class:`OverBudget` the moment the bytes it tracks exceed the budget — inside the
allocating operator, like an allocator that runs dry — naming the phase and the category that
grew. A budget, not the machine's RAM, bounds the rank: the learner's kernel is never at risk.
``oom_run`` trains chapter 01's GPT data-parallel with one rank broken (a larger batch, or a
list that keeps every step's logits); ``predicted_peaks`` is chapter 01's predictor, per rank,
from the sizes alone, to put beside what the run did.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.common.models import GPT, get_config
from course_lib.data_parallel.by_hand import average_gradients
from course_lib.launcher.launch import run
from course_lib.memory import predict
from course_lib.memory.report import categorize, format_bytes
from course_lib.memory.tracker import GlobalMemTracker

__all__ = ["OOM_CAUSES", "OverBudget", "BudgetTracker", "rank_batch_sizes", "predicted_peaks",
           "oom_run"]

OOM_CAUSES = ("none", "big_batch", "leak")
PRESET, SEQ_LEN = "tiny", 64


class OverBudget(MemoryError):
    """A rank's tracked tensors went over its budget. ``grown`` is bytes per category added since
    the tracker started; ``at_step_start`` what each category held when this step began."""

    def __init__(self, rank: int, budget: int, total: int, phase: str, grown: dict,
                 at_step_start: dict):
        self.rank, self.budget, self.total, self.phase = rank, budget, total, phase
        self.grown, self.at_step_start = grown, at_step_start
        self.category = max(grown, key=grown.get)
        held = at_step_start.get(self.category, 0)
        note = ""
        if self.category == "activations" and held:
            note = (f"; {format_bytes(held)} of them were alive before this step's forward: "
                    "something keeps tensors from earlier steps")
        super().__init__(f"rank {rank} went over its memory budget of {format_bytes(budget)} in "
                         f"{phase}: {format_bytes(total)} of tensors alive; {self.category} grew "
                         f"the most (+{format_bytes(grown[self.category])}){note}")


class BudgetTracker(GlobalMemTracker):
    """A ``MemTracker`` that raises :class:`OverBudget` once its total exceeds ``budget`` bytes.

    Set ``phase`` (e.g. ``"step 2 forward"``) as the loop goes; call :meth:`step_started` at the
    start of each step so that the error can tell what was already alive then.
    """

    def __init__(self, budget: int, rank: int = 0) -> None:
        super().__init__()
        self.budget, self.rank, self.phase = int(budget), rank, "start"
        self._base: dict = {}
        self._step_start: dict = {}
        self.peak_total = 0

    def __enter__(self):
        out = super().__enter__()
        self._base = categorize(self.get_tracker_snapshot())
        return out

    def step_started(self) -> None:
        self._step_start = categorize(self.get_tracker_snapshot())

    def _update_peak_stats(self, peak_state: object) -> None:
        super()._update_peak_stats(peak_state)
        total = sum(snap["Total"] for snap in self._curr_mem_snap.values())
        self.peak_total = max(self.peak_total, total)
        if total > self.budget:
            now = categorize(self.get_tracker_snapshot())
            grown = {k: v - self._base.get(k, 0) for k, v in now.items()}
            raise OverBudget(self.rank, self.budget, total, self.phase, grown, self._step_start)


def rank_batch_sizes(cause: str, batch_size: int, nprocs: int) -> list[int]:
    """Each rank's batch: ``big_batch`` gives the last rank 4 times the others'."""
    return [4 * batch_size if cause == "big_batch" and r == nprocs - 1 else batch_size
            for r in range(nprocs)]


def predicted_peaks(cause: str = "none", batch_size: int = 8, nprocs: int = 2) -> list[int]:
    """Chapter 01's predicted peak of one fp32 Adam step, per rank (a leak it cannot know)."""
    _validate(cause, batch_size, nprocs)
    return [predict.peak_bytes(PRESET, b, SEQ_LEN)
            for b in rank_batch_sizes(cause, batch_size, nprocs)]


def _validate(cause: str, batch_size: int, nprocs: int) -> None:
    if cause not in OOM_CAUSES:
        raise ValueError(f"cause must be one of {list(OOM_CAUSES)}, got {cause!r}")
    if not (isinstance(batch_size, int) and batch_size >= 1 and isinstance(nprocs, int)
            and nprocs >= 2):
        raise ValueError(f"batch_size must be an int >= 1 and nprocs >= 2, got {batch_size!r}, "
                         f"{nprocs!r}")


def _oom_rank(cause: str, budget: int, batch_size: int, steps: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = GPT(get_config(PRESET))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    b = rank_batch_sizes(cause, batch_size, world)[rank]
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, 256, (b, SEQ_LEN + 1), generator=gen) for _ in range(steps)]
    kept = []  # the leak: "logits kept for a metric later", never cleared
    tracker = BudgetTracker(budget, rank)
    tracker.track_external(model, opt, *batches)  # the batches count as inputs
    with tracker:
        for step, tokens in enumerate(batches, 1):
            tracker.reset_mod_stats()
            opt.zero_grad(set_to_none=True)
            tracker.step_started()
            tracker.phase = f"step {step} forward"
            logits = model(tokens[:, :-1])
            loss = GPT.loss(logits, tokens[:, 1:])
            if cause == "leak" and rank == world - 1:
                kept.append(logits)
            del logits
            tracker.phase = f"step {step} backward"
            loss.backward()
            del loss
            average_gradients(model)
            tracker.phase = f"step {step} optimizer step"
            opt.step()
    return {"batch_size": b, "steps": steps, "peak": tracker.peak_total}


def oom_run(cause: str = "none", budget: int = 10 * 2**20, batch_size: int = 8, steps: int = 6,
            nprocs: int = 2) -> list[dict]:
    """Train chapter 01's ``tiny`` GPT on ``nprocs`` ranks, each under ``budget`` bytes of tracked
    tensors; per rank ``{"batch_size", "steps", "peak"}``, or a ``RankError`` from the rank that
    went over (its :class:`OverBudget` message names the phase and the category that grew)."""
    _validate(cause, batch_size, nprocs)
    if not (isinstance(budget, int) and budget > 0 and isinstance(steps, int) and steps >= 1):
        raise ValueError(f"budget (bytes) and steps must be positive ints, got {budget!r}, {steps!r}")
    return run(_oom_rank, nprocs, cause, budget, batch_size, steps)
