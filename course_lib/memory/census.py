"""The memory census of training steps: torch's own tracker, one snapshot after every phase.

Chapter 1 (``01_training_memory``) types :func:`census` in a cell that the learner edits and
reruns on their own model; ``tests/test_cell_library_identity.py`` keeps the cell and this copy
identical. :func:`course_lib.memory.tracker.tracked_steps` (and so ``measure_step`` and every
later chapter's per-rank measurement) runs this same function, with a faster tracker subclass.
"""
from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

__all__ = ["census"]


def census(model, optimizer, batch, loss_fn, tracker=None, iterations=2, autocast_dtype=None):
    """Run ``iterations`` training steps under torch's ``MemTracker``: ``(timeline, peak)``.

    ``timeline`` is ``[(phase, snapshot), ...]`` after every phase, a snapshot being the
    tracker's ``{device: {category: bytes}}``; ``peak`` is the largest snapshot it saw. A
    ``tracker`` passed in must already know the model, the optimizer and the batch.
    """
    inputs, targets = batch
    if tracker is None:
        tracker = MemTracker()
        tracker.track_external(model, optimizer, inputs, targets)
    device = next(model.parameters()).device
    timeline = []
    with tracker:
        timeline.append(("start", tracker.get_tracker_snapshot()))
        for it in range(1, iterations + 1):
            tracker.reset_mod_stats()
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = loss_fn(model(inputs), targets)
            timeline.append((f"{it} forward", tracker.get_tracker_snapshot()))
            loss.backward()
            del loss
            timeline.append((f"{it} backward", tracker.get_tracker_snapshot()))
            optimizer.step()
            timeline.append((f"{it} step", tracker.get_tracker_snapshot()))
    return timeline, tracker.get_tracker_snapshot("peak")
