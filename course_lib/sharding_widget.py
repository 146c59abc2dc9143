"""Chapter 3's explorer: strategy × world size × model size × precision → a real run, measured
per rank next to the ZeRO formulas, with the bytes sent and the step time.

:func:`sharding_explorer` is the plain function (tests call it); :func:`show_sharding_explorer`
prints and draws its result; :func:`sharding_widget` puts ipywidgets in front of it.
:func:`load_fake_7b` and :func:`fit_table` read the stored fake-tensor measurements of the 7B GPT
on 8 ranks (``benchmarks/bench_fake_7b.py`` writes them; a fake 7B run takes minutes).
"""
from __future__ import annotations

import json
from pathlib import Path

from course_lib.distributed_memory import measure_distributed
from course_lib.memory_report import MemoryReport
from course_lib.models import get_config, param_count
from course_lib.sharding_plots import plot_ranks
from course_lib.strategies import DIST_PRECISIONS, STRATEGIES
from course_lib.zero import NAMES_IN_THE_WILD, comm_bytes, param_shapes, per_rank_bytes

__all__ = ["sharding_explorer", "show_sharding_explorer", "sharding_widget", "per_rank_table",
           "load_fake_7b", "fit_table", "names_markdown", "FAKE_7B_PATH"]

FAKE_7B_PATH = Path(__file__).resolve().parent.parent / "data" / "sharding_7b.json"
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
    import matplotlib.pyplot as plt

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

    style = {"description_width": "initial"}
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
    lines = [f"{'strategy':<9}{'precision':<10}{'states':>11}{'fwd→bwd':>11}{'peak':>11}  fits"]
    for r in rows:
        b = r["bytes"]
        fits = "yes" if b["peak"] < gpu_bytes else "no"
        lines.append(f"{r['strategy']:<9}{r['precision']:<10}{b['model_states'] / 1e9:>8.1f} GB"
                     f"{b['model_states_fwd'] / 1e9:>8.1f} GB{b['peak'] / 1e9:>8.1f} GB  {fits}")
    return "\n".join(lines)


def names_markdown() -> str:
    """:data:`course_lib.zero.NAMES_IN_THE_WILD` as a markdown table."""
    cols = list(NAMES_IN_THE_WILD[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(f"`{row[c]}`" if c in ("course", "DeepSpeed") else row[c]
                              for c in cols) + " |" for row in NAMES_IN_THE_WILD]
    return "\n".join(out)
