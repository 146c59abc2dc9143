"""What the figure tests read back from a matplotlib Figure: patches by gid, every visible text."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.text import Text

from course_lib.display import FONT_MIN


def patches(fig: Figure, prefix: str) -> list:
    """Every patch of the figure whose gid starts with ``prefix``, in drawing order."""
    return [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


def texts(fig: Figure) -> list[Text]:
    """Every visible, non-empty text: titles, labels, tick labels, legends, annotations."""
    fig.canvas.draw()  # tick labels exist only once drawn
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def too_small(fig: Figure, minimum: float = FONT_MIN) -> list[str]:
    """The texts drawn below ``minimum`` points (the course's floor: readable at 1400 px)."""
    return [f"{t.get_text()!r} at {t.get_fontsize():g} pt" for t in texts(fig)
            if t.get_fontsize() < minimum]
