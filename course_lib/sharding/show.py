"""Chapter 3's figures, tables and widget: per-rank bytes, measured next to the formula.

Figures take measurements (:class:`~course_lib.memory.report.MemoryReport` lists from
:func:`course_lib.sharding.measure.measure_distributed`) and formula rows
(:func:`course_lib.sharding.formulas.per_rank_bytes`): solid bars measured, hatched the formula.
:func:`sharding_explorer` (tests call it) runs strategy × world size × model × precision;
:func:`sharding_widget` puts ipywidgets in front of it; :func:`load_fake_7b` and
:func:`fit_table` read the stored fake-tensor 7B measurement.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.common.models import get_config, param_count
from course_lib.display import COLORS, DPI, FIGSIZE, FONT_MIN, PALETTE, WIDGET_STYLE
from course_lib.memory.report import MemoryReport, byte_unit, format_bytes
from course_lib.sharding.formulas import comm_bytes, param_shapes, per_rank_bytes
from course_lib.sharding.measure import measure_distributed
from course_lib.sharding.strategies import DIST_PRECISIONS, STRATEGIES
from course_lib.common.plots import legible

__all__ = ["PARTS", "plot_ranks", "plot_strategies", "plot_comm", "format_memory_vs_world",
           "sharding_explorer", "show_sharding_explorer", "sharding_widget", "per_rank_table",
           "load_fake_7b", "fit_table", "FAKE_7B_PATH"]

#: What the bars stack, bottom to top, with colours.
PARTS = {"params": COLORS["params"], "unsharded_params": PALETTE[4], "grads": COLORS["grads"],
         "optimizer": COLORS["optimizer"]}


def _parts(moment: str) -> list[str]:
    """What is alive at ``moment``: no gathered parameters after the step, no grads in forward."""
    return [p for p in PARTS if (p, moment) not in (("unsharded_params", "steady"),
                                                    ("grads", "fwd"))]


def _bars(ax, x: float, measured: Mapping[str, int], formula: Mapping[str, int], scale: float,
          moment: str) -> None:
    """Two stacked bars at ``x``: measured (solid, left) and the formula (hatched, right)."""
    for dx, row, hatched in ((-0.2, measured, False), (0.2, formula, True)):
        bottom = 0.0
        for part in _parts(moment):
            value = row.get(part, 0) / scale
            ax.bar(x + dx, value, 0.38, bottom=bottom, color=PARTS[part],
                   alpha=0.55 if hatched else 1.0, hatch="//" if hatched else None,
                   edgecolor="white" if not hatched else "k", linewidth=0.4)
            bottom += value


def _legend(ax, moment: str) -> None:
    shown = _parts(moment)
    handles = [plt.Rectangle((0, 0), 1, 1, color=PARTS[p]) for p in shown]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="k", hatch="//"))
    ax.legend(handles, shown + ["formula"], fontsize=FONT_MIN, ncol=2, loc="upper center",  # below
              bbox_to_anchor=(0.5, -0.12), frameon=False, handlelength=1.2, columnspacing=0.8)


@legible
def plot_ranks(reports: Sequence[Mapping[str, int]], formula: Sequence[Mapping[str, int]],
               title: str, moment: str = "steady") -> Figure:
    """One strategy: each rank's model states, measured (solid) beside the formula (hatched).

    ``moment="steady"`` after the optimizer step; ``"fwd"`` at the end of forward (FSDP's
    gathered full parameters alive, sharded gradients freed).
    """
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    top = max(sum(r.get(p, 0) for p in PARTS) for r in list(reports) + list(formula))
    unit, scale = byte_unit(top)
    for rank, (measured, predicted) in enumerate(zip(reports, formula)):
        _bars(ax, rank, measured, predicted, scale, moment)
    ax.set_xticks(range(len(reports)), [f"rank {r}" for r in range(len(reports))])
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=FONT_MIN + 1)
    _legend(ax, moment)
    fig.tight_layout()
    return fig


@legible
def plot_strategies(results: Mapping[str, Sequence[Mapping[str, int]]],
                    formulas: Mapping[str, Sequence[Mapping[str, int]]], rank: int = 0,
                    title: str = "Model states of one rank") -> Figure:
    """Several strategies side by side: rank ``rank`` after the step and at the end of forward."""
    fig, axes = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI, sharey=True)
    names = list(results)
    top = max(sum(r[rank].get(p, 0) for p in PARTS) for r in list(results.values())
              + list(formulas.values()))
    unit, scale = byte_unit(top)
    for ax, moment, label in ((axes[0], "steady", "after the step"),
                              (axes[1], "fwd", "end of forward")):
        for i, name in enumerate(names):
            _bars(ax, i, results[name][rank], formulas[name][rank], scale, moment)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(f"{title}:\n{label}", fontsize=FONT_MIN)
        _legend(ax, moment)
    axes[0].set_ylabel(unit)
    fig.tight_layout()
    return fig


@legible
def plot_comm(comm: Mapping[str, Mapping[str, int]], title: str = "Bytes handed to collectives per step") -> Figure:
    """Stacked bars of message bytes per collective type, one bar per strategy."""
    colours = {"all_reduce": PALETTE[5], "all_gather": PALETTE[3], "reduce_scatter": PALETTE[4],
               "broadcast": PALETTE[6]}
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], 3.0), dpi=DPI)
    top = max([sum(c.values()) for c in comm.values()] + [1])
    unit, scale = byte_unit(top)
    for i, (name, by_type) in enumerate(comm.items()):
        bottom = 0.0
        for kind, colour in colours.items():
            value = by_type.get(kind, 0) / scale
            ax.bar(i, value, 0.6, bottom=bottom, color=colour, label=kind if i == 0 else None)
            bottom += value
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=FONT_MIN, loc="upper left", bbox_to_anchor=(1.0, 1.0),
              frameon=False)   # beside the bars: inside, it covered the first one
    ax.set_xticks(range(len(comm)), list(comm))
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=FONT_MIN + 1)
    fig.tight_layout()
    return fig


FAKE_7B_PATH = Path(__file__).resolve().parents[2] / "data" / "sharding_7b.json"
_KEYS = ("params", "grads", "optimizer", "model_states", "unsharded_params", "model_states_fwd")


def sharding_explorer(strategy: str = "fsdp", nprocs: int = 2, preset: str = "tiny",
                      precision: str = "fp32", batch_size: int = 4, seq_len: int = 32) -> dict:
    """Run ``measure_distributed`` once and put the formulas beside it.

    Returns ``{"reports": [MemoryReport per rank], "formula": [dict per rank],
    "comm_measured": {...}, "comm_formula": {...}, "step_time_s": float}``.
    """
    config = get_config(preset)
    reports = measure_distributed(config, (batch_size, seq_len), strategy=strategy, nprocs=nprocs,
                                  precision=precision)
    shapes = param_shapes(config)
    return {"reports": reports, "formula": per_rank_bytes(shapes, strategy, nprocs,
                                                          precision=precision),
            "comm_measured": reports[0].info["comm"]["bytes"],
            "comm_formula": comm_bytes(shapes, strategy, nprocs, precision),
            "step_time_s": max(r.info["step_time_s"] for r in reports)}


def per_rank_table(reports: list[MemoryReport], formula: list[dict], keys=_KEYS) -> str:
    """Text table: one line per rank and key, measured, formula and whether they agree."""
    lines = [f"{'rank':>4} {'key':<17}{'measured':>14}{'formula':>14}  same"]
    for rank, (report, row) in enumerate(zip(reports, formula)):
        for key in keys:
            lines.append(f"{rank:>4} {key:<17}{report[key]:>14,}{row[key]:>14,}  "
                         f"{'yes' if report[key] == row[key] else 'NO'}")
    return "\n".join(lines)


def show_sharding_explorer(strategy: str = "fsdp", nprocs: int = 2, preset: str = "tiny",
                           precision: str = "fp32") -> None:
    """Print and draw :func:`sharding_explorer` (errors are printed, not raised)."""
    try:
        out = sharding_explorer(strategy, nprocs, preset, precision)
    except (ValueError, MemoryError) as err:
        print(f"{type(err).__name__}: {err}")
        return
    psi = param_count(get_config(preset))
    print(f"{preset}: {psi:,} parameters, {strategy} on {nprocs} rank(s), {precision}")
    print(per_rank_table(out["reports"], out["formula"], ("params", "grads", "optimizer",
                                                          "model_states", "model_states_fwd")))
    sent = sum(out["comm_measured"].values())
    print(f"bytes handed to collectives per step: {out['comm_measured']} "
          f"(formula {out['comm_formula']}; {sent / (4 * psi):.2f} × 4Ψ)")
    print(f"step time (slowest rank): {out['step_time_s'] * 1e3:.1f} ms")
    for moment, label in (("steady", "after the step"), ("fwd", "end of forward")):
        plot_ranks(out["reports"], out["formula"], f"{strategy}, {nprocs} ranks: {label}", moment)
    plt.show()


def sharding_widget():
    """Dropdowns over :func:`show_sharding_explorer`; each change launches a real run."""
    import ipywidgets as w

    style = WIDGET_STYLE
    return w.interactive(
        show_sharding_explorer, {"manual": True, "manual_name": "Run"},
        strategy=w.Dropdown(options=list(STRATEGIES), value="fsdp", style=style),
        nprocs=w.Dropdown(options=[1, 2, 4], value=2, description="world size", style=style),
        preset=w.Dropdown(options=["tiny", "small", "medium"], value="tiny", style=style),
        precision=w.Dropdown(options=list(DIST_PRECISIONS), value="fp32", style=style),
    )


def load_fake_7b(path: Path | str = FAKE_7B_PATH) -> list[dict]:
    """Rows stored by ``benchmarks/bench_fake_7b.py``: rank 0 of the 7B GPT on 8 fake ranks."""
    return json.loads(Path(path).read_text())["rows"]


def fit_table(rows: list[dict], gpu_bytes: float = 80e9) -> str:
    """Model states, forward-moment states, peak and the verdict (peak < ``gpu_bytes``) per row."""
    lines = [f"{'strategy':<16}{'precision':<10}{'states':>11}{'fwd→bwd':>11}{'peak':>11}  fits"]
    for r in rows:
        b = r["bytes"]
        fits = "yes" if b["peak"] < gpu_bytes else "no"
        lines.append(f"{r['strategy']:<16}{r['precision']:<10}{b['model_states'] / 1e9:>8.1f} GB"
                     f"{b['model_states_fwd'] / 1e9:>8.1f} GB{b['peak'] / 1e9:>8.1f} GB  {fits}")
    return "\n".join(lines)


def format_memory_vs_world(per_world: Mapping[int, Mapping[str, int]]) -> str:
    """A table of :func:`memory_vs_world`: bytes and bytes per parameter per rank."""
    lines = [f"{'ranks':>5}{'params':>12}{'grads':>12}{'optimizer':>12}{'model states':>14}"
             f"{'B/param':>9}"]
    for world, row in sorted(per_world.items()):
        lines.append(f"{world:>5}{format_bytes(row['params']):>12}{format_bytes(row['grads']):>12}"
                     f"{format_bytes(row['optimizer']):>12}"
                     f"{format_bytes(row['model_states']):>14}"
                     f"{row['model_states'] / row['n_params']:>9.2f}")
    return "\n".join(lines)
