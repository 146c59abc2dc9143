"""Figure style shared by every chapter's figures, source shown side by side, text with a fold.

Figures are small (7×3.5 in at 80 dpi) so that stored notebook outputs stay light. No matplotlib
here: the ``show`` modules import it; this module only holds the numbers they agree on.
"""
from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import pathlib
from typing import Mapping

__all__ = ["FIGSIZE", "DPI", "PALETTE", "OKABE_ITO", "COLORS", "RANK_COLORS", "SUM_COLOR", "GREY",
           "PALE", "FONT_MIN", "MIN_PT", "STYLE", "WIDGET_STYLE", "ink", "side_by_side",
           "show_source", "Folded"]

FIGSIZE = (7.0, 3.5)
DPI = 80
#: The one palette: Okabe & Ito's eight colours, safe for the common colour-vision deficiencies.
#: Ranks (rank r: ``PALETTE[r % 8]``), chunks, groups and kinds of work take them in this order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000")
OKABE_ITO = RANK_COLORS = PALETTE   # the names chapters used before there was one palette
#: Neutral: what is no rank's and no category's (bubbles, frozen weights, "other").
GREY = "#999999"
#: One colour per memory category, the same in every chapter's figures (taken from PALETTE).
COLORS: Mapping[str, str] = {
    "params": PALETTE[0], "grads": PALETTE[1], "optimizer": PALETTE[2], "buffers": PALETTE[3],
    "temporaries": PALETTE[4], "activations": PALETTE[5], "inputs": GREY,
}
#: An empty slot: a pipeline bubble, a byte range a rank does not hold.
PALE = "#e6e6e6"
#: A value summed over all ranks (chapter 2's collectives draw sums in it too).
SUM_COLOR = "#cccccc"
#: The smallest text in any figure, in matplotlib points: at DPI 80, 11 pt is 12 px, which is
#: 9 CSS pt where the PNG is shown at its own size (JupyterLab and the web edition do, up to
#: the page's width). ``MIN_PT`` is its older name.
FONT_MIN = MIN_PT = 11
#: The matplotlib rcParams every figure function draws under (``common.plots.legible``): text
#: that names no size (tick labels, axis labels, legends) starts at the floor, not at 10 pt.
STYLE: Mapping[str, object] = {"font.size": FONT_MIN, "legend.title_fontsize": FONT_MIN}
#: Every ipywidget's ``style``: a label gets the width it needs instead of wrapping mid-word in
#: the default 80-px column ("activation|s").
WIDGET_STYLE: Mapping[str, str] = {"description_width": "initial"}


def ink(colour: str) -> str:
    """Black or white, whichever reads better on ``colour`` (a ``#rrggbb`` string)."""
    r, g, b = (int(colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"

def side_by_side(left: object, right: object, titles: tuple[str, str] = ("", "")):
    """Two objects' source code (read with ``inspect``, never copied) in two HTML columns.

    IPython is imported on call: only notebooks call this, and scripts should not pay for it.
    """
    from IPython.display import HTML

    cells = "".join(
        f"<td style='vertical-align:top;text-align:left'><b>{html.escape(title)}</b>"
        f"<pre style='font-size:11px'>{html.escape(inspect.getsource(obj))}</pre></td>"
        for title, obj in zip(titles, (left, right)))
    return HTML(f"<table><tr>{cells}</tr></table>")


def show_source(*objects: object, open: bool = False):
    """Library source (read with ``inspect``), folded under one summary line per object.

    A notebook shows what a tool does on demand without a screen of code in the way; ``open=True``
    for the one place where the code is the point (a whole script). An object may also be named
    (``"course_lib.composition.compose.build_2d"``): its file is read, not imported, so a kernel
    shows code whose imports (FSDP2, DTensor) only its ranks need. IPython is imported on call.
    """
    from IPython.display import HTML

    parts = []
    for obj in objects:
        if isinstance(obj, str):
            name, where, lines = _named_source(obj)
        else:
            lines, first = inspect.getsourcelines(obj)
            name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
            where = inspect.getsourcefile(obj) or "?"
        where = where[where.rfind("course_lib"):] if "course_lib" in where else where.rsplit("/", 1)[-1]
        parts.append(f"<details{' open' if open else ''}><summary>source of <code>{html.escape(name)}</code>"
                     f" ({html.escape(where)}, {len(lines)} lines)</summary>"
                     f"<pre style='font-size:0.85em'>{html.escape(''.join(lines))}</pre></details>")
    return HTML("".join(parts))


def _named_source(dotted: str) -> tuple[str, str, list[str]]:
    """``(qualname, file, lines)`` of the function or class ``package.module.qualname``, read
    from the module's file with ``ast`` (the module is not imported; its packages are)."""
    parts = dotted.split(".")
    for cut in range(1, len(parts)):  # packages first: finding a module imports only them
        spec = importlib.util.find_spec(".".join(parts[:cut]))
        if spec is None or not (spec.origin or "").endswith(".py"):
            raise ValueError(f"no Python module or package {'.'.join(parts[:cut])!r}")
        if spec.submodule_search_locations is None:
            break
    else:
        raise ValueError(f"{dotted!r} names a package, not a function or class in a module")
    text = pathlib.Path(spec.origin).read_text(encoding="utf-8")
    body, node = ast.parse(text).body, None
    for name in parts[cut:]:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.ClassDef)) and n.name == name), None)
        if node is None:
            raise ValueError(f"{'.'.join(parts[:cut])} defines no {'.'.join(parts[cut:])}")
        body = node.body
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = text.splitlines(keepends=True)[first - 1:node.end_lineno]
    return ".".join(parts[cut:]), spec.origin, lines


class Folded:
    """``text``, then ``raw`` under the heading ``label``: below it as text, folded in HTML."""

    def __init__(self, text: str, raw: str = "", label: str = "raw output") -> None:
        self.text, self.raw, self.label = text.rstrip(), raw.rstrip(), label

    def __repr__(self) -> str:
        return self.text + (f"\n--- {self.label} ---\n{self.raw}" if self.raw else "")

    def _repr_html_(self) -> str:
        head = f'<pre style="white-space: pre-wrap">{html.escape(self.text)}</pre>'
        if not self.raw:
            return head
        return (f"{head}<details><summary>{html.escape(self.label)}</summary>"
                f'<pre style="white-space: pre-wrap">{html.escape(self.raw)}</pre></details>')
