"""Figure style shared by every chapter's figures, and source shown side by side.

Figures are small (7×3.5 in at 80 dpi) so that stored notebook outputs stay light. No matplotlib
here: the ``show`` modules import it; this module only holds the numbers they agree on.
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["FIGSIZE", "DPI", "COLORS", "RANK_COLORS", "SUM_COLOR", "FONT_MIN", "side_by_side",
           "show_source"]

FIGSIZE = (7.0, 3.5)
DPI = 80
#: One colour per memory category, the same in every chapter's figures.
COLORS: Mapping[str, str] = {
    "params": "#4c72b0", "buffers": "#8172b3", "grads": "#dd8452", "optimizer": "#55a868",
    "activations": "#c44e52", "temporaries": "#937860", "inputs": "#8c8c8c",
}
#: One colour per rank (rank r: ``RANK_COLORS[r % len(RANK_COLORS)]``), the conceptual figures'.
RANK_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
               "#8c8c8c")
#: A value summed over all ranks (chapter 2's collectives draw sums in it too).
SUM_COLOR = "#bbbbbb"
#: Smallest font size (pt) in a figure: at DPI 80, 9 pt is 10 px where the PNG is shown 1:1.
FONT_MIN = 9


def side_by_side(left: object, right: object, titles: tuple[str, str] = ("", "")):
    """Two objects' source code (read with ``inspect``, never copied) in two HTML columns.

    IPython is imported on call: only notebooks call this, and scripts should not pay for it.
    """
    import html
    import inspect

    from IPython.display import HTML

    cells = "".join(
        f"<td style='vertical-align:top;text-align:left'><b>{html.escape(title)}</b>"
        f"<pre style='font-size:11px'>{html.escape(inspect.getsource(obj))}</pre></td>"
        for title, obj in zip(titles, (left, right)))
    return HTML(f"<table><tr>{cells}</tr></table>")


def show_source(*objects: object, open: bool = False):
    """Library source (read with ``inspect``), folded under one summary line per object.

    A notebook shows what a tool does on demand without a screen of code in the way; ``open=True``
    for the one place where the code is the point (a whole script). IPython is imported on call.
    """
    import html
    import inspect

    from IPython.display import HTML

    parts = []
    for obj in objects:
        lines, first = inspect.getsourcelines(obj)
        name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
        where = inspect.getsourcefile(obj) or "?"
        where = where[where.rfind("course_lib"):] if "course_lib" in where else where.rsplit("/", 1)[-1]
        parts.append(f"<details{' open' if open else ''}><summary>source of <code>{html.escape(name)}</code>"
                     f" ({html.escape(where)}, {len(lines)} lines)</summary>"
                     f"<pre style='font-size:0.85em'>{html.escape(''.join(lines))}</pre></details>")
    return HTML("".join(parts))
#: Okabe & Ito's eight colours (safe for the common colour-vision deficiencies): ranks, chunks,
#: groups and actions in the conceptual figures (chapters 05-09), in this order.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
             "#000000")
#: Smallest text in a conceptual figure: 11 pt at DPI 80 is 12 px, 9 CSS pt when the PNG is
#: shown at its own size (JupyterLab does, up to the notebook's width).
MIN_PT = 11
