"""What each rank of :func:`course_lib.composition.measure.run_parallel` runs for a GPT layout.

Its imports are the heavy ones (FSDP2 and DTensor, and sympy through them): ``run_parallel``
hands :func:`rank_2d` to ``run`` by name (:class:`course_lib.launcher.by_name.ByName`), so a
notebook that calls it, and only shows the source it runs, never imports them (issue 50).
"""
from __future__ import annotations

from course_lib.composition.compose import train_2d
from course_lib.composition.layout import Layout
from course_lib.composition.measure import LR, quiet_dtensor_notes
from course_lib.composition.pipeline import train_pp

__all__ = ["rank_2d"]


def rank_2d(config, layout: Layout, steps, batch):
    """Train the GPT on this rank of ``layout``: a hand-made pipeline with ``pp``, else FSDP2/TP."""
    quiet_dtensor_notes()
    if layout.pp > 1:
        return train_pp(config, layout, steps, batch, lr=LR)
    return train_2d(config, layout, steps, batch, lr=LR)
