"""The text floor every course figure keeps: ``legible`` wraps a function that returns a Figure.

matplotlib sizes a text that names no size (tick labels, axis labels, legends) from rcParams, at
10 pt by default: under the course's 11-pt floor (``display.FONT_MIN``, 9 CSS pt at DPI 80). The
figure is drawn once under ``display.STYLE`` so that its tick labels exist at the floor's size
before the notebook draws it again outside; lines that name no colour take the course's palette.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

from course_lib.display import PALETTE, STYLE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["legible"]


def legible(draw: Callable[..., "Figure"]) -> Callable[..., "Figure"]:
    """``draw`` run under the course's figure style; it returns the same Figure. matplotlib is
    imported on call: a module may wrap its figures and still be imported without it."""
    @functools.wraps(draw)
    def drawn(*args, **kwargs) -> "Figure":
        import matplotlib.pyplot as plt
        from cycler import cycler

        style = {**STYLE, "axes.prop_cycle": cycler(color=PALETTE)}
        saved = {key: plt.rcParams[key] for key in style}
        plt.rcParams.update(style)   # not rc_context: it would also undo what the first figure
        try:                         # of a kernel sets (the inline backend's interactive mode)
            fig = draw(*args, **kwargs)
            fig.draw_without_rendering()  # tick labels are made now, at the style's sizes
        finally:
            plt.rcParams.update(saved)
        return fig
    return drawn
