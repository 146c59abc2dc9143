"""Chapter 09's figures, byte verdicts and widget.

:func:`plot_mesh` draws a real ``DeviceMesh`` (what :func:`~course_lib.composition.mesh.show_meshes`
returned from the ranks); :func:`plot_schedule_order` the plan torch's schedule objects made
(:func:`~course_lib.composition.schedule_order.torch_schedule_order`); :func:`bytes_summary` folds
a run's per-rank byte table into one verdict line; the widget reads the model states at scale.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from course_lib.composition.layout import Layout
from course_lib.composition.scale import SCALE_PRESETS, at_scale
from course_lib.display import DPI, FONT_MIN, GREY, PALETTE, WIDGET_STYLE, ink
from course_lib.common.plots import legible

if TYPE_CHECKING:
    from course_lib.composition.measure import ParallelReport

__all__ = ["layout_widget", "layout_line", "plot_mesh", "plot_schedule_order", "bytes_summary",
           "bubble_lines"]

_ACTION = re.compile(r"(\d+)([A-Z_]+)(\d*)")
_KINDS = {"F": ("forward", PALETTE[0]), "B": ("backward (full)", PALETTE[5]),
          "I": ("backward, input grad", PALETTE[1]), "W": ("backward, weight grad", PALETTE[2])}


def _cell(coordinate: Sequence[int], shape: Sequence[int]) -> tuple[float, int]:
    """Where a rank's square goes: 1-D a row, 2-D the grid, 3-D blocks of dim 0 side by side."""
    if len(shape) == 1:
        return float(coordinate[0]), 0
    if len(shape) == 2:
        return float(coordinate[1]), coordinate[0]
    return coordinate[0] * (shape[2] + 0.6) + coordinate[2], coordinate[1]


@legible
def plot_mesh(ranks: Sequence[Mapping]) -> Figure:
    """One panel per mesh dimension: every rank at its mesh coordinate, coloured by the process
    group it joins along that dimension (the group's ranks as ``dist.get_process_group_ranks``
    read them inside the rank)."""
    names = list(ranks[0]["dims"])
    shape = [len(ranks[0]["dims"][n]["group_ranks"]) for n in names]
    cells = {r["rank"]: _cell([r["dims"][n]["coordinate"] for n in names], shape) for r in ranks}
    width = max(x for x, _ in cells.values()) + 1
    rows = max(y for _, y in cells.values()) + 1
    fig, axes = plt.subplots(1, len(names), figsize=(7.0, 1.2 + 0.6 * rows), dpi=DPI,
                             squeeze=False)
    for ax, name in zip(axes[0], names):
        groups = sorted({tuple(r["dims"][name]["group_ranks"]) for r in ranks})
        for r in ranks:
            x, y = cells[r["rank"]]
            group = groups.index(tuple(r["dims"][name]["group_ranks"]))
            ax.add_patch(Rectangle((x, -y), 0.9, 0.9, color=PALETTE[group % len(PALETTE)],
                                   alpha=0.85))
            ax.text(x + 0.45, -y + 0.45, str(r["rank"]), ha="center", va="center",
                    fontsize=FONT_MIN + 1, color=ink(PALETTE[group % len(PALETTE)]))
        ax.set(xlim=(-0.1, width), ylim=(-rows + 0.9, 1.0), aspect="equal", xticks=[], yticks=[])
        ax.set_title(f"{name}: {len(groups)} × {len(groups[0])} ranks", fontsize=FONT_MIN)
        for side in ax.spines.values():
            side.set_visible(False)
    dims = " × ".join(f"{n} {s}" for n, s in zip(names, shape))
    fig.suptitle(f"DeviceMesh {dims}: same colour = one process group", fontsize=FONT_MIN)
    place = (f"left to right: {names[0]}" if len(names) == 1 else
             f"rows: {names[0]}, columns: {names[1]}" if len(names) == 2 else
             f"blocks: {names[0]}, rows: {names[1]}, columns: {names[2]}")
    fig.supxlabel(place, fontsize=FONT_MIN)
    fig.tight_layout()
    return fig


@legible
def plot_schedule_order(orders: Mapping[str, Mapping[int, Sequence]]) -> Figure:
    """One panel per schedule, one row per rank, one column per time step of torch's plan:
    the action's kind as colour, its micro-batch as the number, paler = the rank's later stage."""
    fig, axes = plt.subplots(len(orders), 1, dpi=DPI, squeeze=False,
                             figsize=(7.0, 0.6 + sum(0.45 * len(o) + 0.5 for o in orders.values())))
    kinds = set()
    for ax, (name, order) in zip(axes[:, 0], orders.items()):
        p = len(order)
        for rank, actions in order.items():
            for t, action in enumerate(actions):
                parsed = _ACTION.fullmatch(action) if action else None
                if parsed is None or parsed[2] not in _KINDS:
                    continue
                stage, kind, micro = int(parsed[1]), parsed[2], parsed[3]
                kinds.add(kind)
                later = stage >= p
                ax.add_patch(Rectangle((t, -rank), 0.95, 0.85, facecolor=_KINDS[kind][1],
                                       alpha=0.45 if later else 1.0, lw=0))
                ax.text(t + 0.47, -rank + 0.42, micro, ha="center", va="center", fontsize=FONT_MIN,
                        color="white" if kind in "FB" and not later else "black")
        steps = max(len(a) for a in order.values())
        ax.set(xlim=(0, steps), ylim=(-p + 0.9, 0.95), yticks=[-r + 0.42 for r in range(p)],
               xlabel="time step of the plan" if ax is axes[-1, 0] else None)
        ax.set_yticklabels([f"rank {r}" for r in range(p)], fontsize=FONT_MIN)
        ax.tick_params(axis="x", labelsize=FONT_MIN)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"{name}: {steps} steps, {sum(a is None for o in order.values() for a in o)}"
                     " idle slots", fontsize=FONT_MIN)
    handles = [Patch(color=_KINDS[k][1], label=_KINDS[k][0]) for k in _KINDS if k in kinds]
    handles.append(Patch(facecolor=GREY, alpha=0.45, label="paler: the rank's later stage"))
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=FONT_MIN, frameon=False)
    fig.tight_layout(rect=(0, 0.07 + 0.05 * (len(handles) > 3), 1, 1))
    return fig


def bytes_summary(report: ParallelReport) -> tuple[str, str]:
    """One verdict line for a run's per-rank byte counts, and the full table as ``<details>`` HTML.

    Ranks with equal bytes are grouped ("ranks 0-3"), so the line stays one line at any size."""
    ranks = report.ranks
    ok = [r.bytes_measured == r.bytes_predicted for r in ranks]
    line = (f"all {len(ranks)} ranks: measured == predicted" if all(ok) else
            f"{ok.count(False)} of {len(ranks)} ranks differ: "
            + ", ".join(str(r.rank) for r, good in zip(ranks, ok) if not good))
    groups: dict[int, list[int]] = {}
    for r in ranks:
        groups.setdefault(r.bytes_measured["model_states"], []).append(r.rank)
    line += " (model states: " + "; ".join(
        f"rank{'s' * (len(g) > 1)} {_span(g)} {b:,} B" for b, g in groups.items()) + ")"
    cols = ("params", "grads", "optimizer", "model_states")
    head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in cols)
    body = "".join(
        f"<tr><td>{r.rank}</td><td>{kind}</td>"
        + "".join(f"<td style='text-align:right'>{getattr(r, f'bytes_{kind}')[c]:,}</td>"
                  for c in cols)
        + "</tr>" for r in ranks for kind in ("measured", "predicted"))
    return line, (f"<details><summary>bytes per rank ({len(ranks)} ranks × measured, predicted)"
                  f"</summary><table><tr><th>rank</th><th></th>{head}</tr>{body}</table></details>")


def bubble_lines(rows: Sequence[Mapping]) -> list[str]:
    """One line per schedule: the measured bubble beside its formula, and which way and by how
    much the measurement lies from it (``rows``: ``schedule``, ``bubble``, ``formula``)."""
    out = []
    for r in rows:
        gap = r["bubble"] - r["formula"]
        where = ("on the formula" if abs(gap) < 0.005 else
                 f"{abs(gap):.2f} {'above' if gap > 0 else 'below'} the formula")
        out.append(f"{r['schedule']:>17}: bubble {r['bubble']:.2f} of the step, formula "
                   f"{r['formula']:.2f} — {where}")
    return out


def _span(ranks: list[int]) -> str:
    """``[0, 1, 2, 3]`` -> ``"0-3"``, ``[0, 2]`` -> ``"0, 2"``."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def layout_line(model: str, tp: int, pp: int, dp_shard: int, gpu_gb: int = 80) -> str:
    """One layout's GPUs and predicted model states per GPU, against a GPU's memory."""
    try:
        r = at_scale(model, Layout(tp=tp, pp=pp, dp_shard=dp_shard))
    except ValueError as err:
        return f"{model}: {err}"
    need = r.per_gpu_bytes
    verdict = "fits" if need < gpu_gb * 1e9 else "does not fit"
    return (f"{model}-class GPT ({r.params / 1e9:.1f}B parameters) on TP {tp} x PP {pp} x FSDP {dp_shard}"
            f" = {r.gpus:,} GPUs: model states {need / 2**30:.1f} GiB per GPU"
            f" — {verdict} in {gpu_gb} GB (activations come on top)")


def layout_widget():
    """Dropdowns over model, tp, pp and dp_shard → :func:`layout_line`."""
    import ipywidgets as widgets

    def show(model: str = "405B", tp: int = 8, pp: int = 16, dp_shard: int = 128) -> None:
        print(layout_line(model, tp, pp, dp_shard))

    one = {"tp": 1, "pp": 1, "dp_shard": 1}
    labels = [(f"{name}-class: {at_scale(name, one).params / 1e9:.1f}B (this course's GPT at that"
               f" model's depth and width)", name) for name in SCALE_PRESETS]
    return widgets.interactive(
        show, model=widgets.Dropdown(options=labels, value="405B",
                                     layout=widgets.Layout(width="max-content"),
style=WIDGET_STYLE),
        tp=widgets.Dropdown(options=[1, 2, 4, 8], value=8, style=WIDGET_STYLE),
        pp=widgets.Dropdown(options=[1, 2, 4, 8, 16], value=16, style=WIDGET_STYLE),
        dp_shard=widgets.Dropdown(options=[1, 8, 16, 64, 128], value=128, style=WIDGET_STYLE))
