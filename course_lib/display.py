"""Figure style shared by every chapter's figures, and source shown side by side.

Figures are small (7×3.5 in at 80 dpi) so that stored notebook outputs stay light. No matplotlib
here: the ``show`` modules import it; this module only holds the numbers they agree on.
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["FIGSIZE", "DPI", "COLORS", "side_by_side"]

FIGSIZE = (7.0, 3.5)
DPI = 80
#: One colour per memory category, the same in every chapter's figures.
COLORS: Mapping[str, str] = {
    "params": "#4c72b0", "buffers": "#8172b3", "grads": "#dd8452", "optimizer": "#55a868",
    "activations": "#c44e52", "temporaries": "#937860", "inputs": "#8c8c8c",
}


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

#: Okabe & Ito's eight colours (safe for the common colour-vision deficiencies): ranks, chunks,
#: groups and actions in the conceptual figures (chapters 05-09), in this order.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
             "#000000")
#: Smallest text in a conceptual figure: 11 pt at DPI 80 is 12 px, 9 CSS pt when the PNG is
#: shown at its own size (JupyterLab does, up to the notebook's width).
MIN_PT = 11
