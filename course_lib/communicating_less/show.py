"""Chapter 11's tables, figure and widget: the hooks' bytes, time and loss; local SGD's H."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from course_lib.communicating_less.measure import compare_local_sgd
from course_lib.display import DPI, FIGSIZE, PALETTE, WIDGET_STYLE
from course_lib.common.plots import legible


def format_hooks(rows: Sequence[Mapping], timed: Mapping[float, Sequence[Mapping]]) -> str:
    """One line per hook: bytes per step (predicted, measured, share), loss, step time per rate."""
    rates = sorted(timed)
    head = (f"{'hook':<12}{'predicted B':>12}{'measured B':>12}{'share':>7}{'loss':>8}"
            + "".join(f"{f'{r:g} Mbit/s ms':>15}" for r in rates))
    lines = [head]
    for row in rows:
        step = {r: next(t["step_s"] for t in timed[r] if t["hook"] == row["hook"]) for r in rates}
        lines.append(f"{row['hook']:<12}{row['predicted_sent']:>12,.0f}{row['sent']:>12,.0f}"
                     f"{row['share']:>7.3f}{row['loss']:>8.4f}"
                     + "".join(f"{1e3 * step[r]:>15.0f}" for r in rates))
    return "\n".join(lines)


@legible
def plot_hooks(rows: Sequence[Mapping], timed: Mapping[float, Sequence[Mapping]]):
    """Left: bytes per step, measured on the sockets; right: step time over each link rate."""
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI)
    names = [r["hook"] for r in rows]
    left.barh(names, [r["sent"] / 1e3 for r in rows], color=PALETTE[0])
    left.set(xscale="log", xlabel="kB a rank sends per step (measured)")
    left.xaxis.set_minor_formatter(NullFormatter())  # 2×10¹, 3×10¹ … collide at 11 pt
    for rate in sorted(timed):
        step = {t["hook"]: t["step_s"] for t in timed[rate]}
        right.plot(names, [1e3 * step[n] for n in names], marker="o",
                   label=f"{rate:g} Mbit/s" if rate else "unshaped")
    right.set_ylabel("ms per step")
    right.tick_params(axis="x", rotation=30)
    right.legend()
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value
    return fig


def format_local_sgd(rows: Sequence[Mapping]) -> str:
    """One line per H: bytes per inner step (predicted, measured), wall time, held-out loss."""
    lines = [f"{'H':>3}{'outer steps':>12}{'predicted B':>13}{'measured B':>12}{'loss':>8}"]
    for row in rows:
        lines.append(f"{row['H']:>3}{row['outer_steps']:>12}{row['predicted_sent']:>13,.0f}"
                     f"{row['sent']:>12,.0f}{row['loss']:>8.4f}")
    return "\n".join(lines)


def local_sgd_widget():
    """A slider over H: each value trains DiLoCo on 2 real ranks (48 inner steps) and prints
    the bytes each rank sent per inner step and the held-out loss."""
    import ipywidgets as widgets

    def show(H: int = 4) -> None:
        print(format_local_sgd(compare_local_sgd((H,), steps=48)))

    return widgets.interactive(show, H=widgets.IntSlider(value=4, min=1, max=24,
                                                         description="H", style=WIDGET_STYLE))
