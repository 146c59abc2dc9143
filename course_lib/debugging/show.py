"""Chapter 10's printouts: what the divergence checker, the NaN flag and the step times said."""
from __future__ import annotations

import matplotlib.pyplot as plt

from course_lib.debugging.measure import CAUSES, drift_run
from course_lib.display import DPI, FIGSIZE, PALETTE, WIDGET_STYLE
from course_lib.common.plots import legible

__all__ = ["format_drift", "plot_step_times", "drift_widget"]


def format_drift(cause: str, seen: list) -> str:
    """One line per checkpoint of :func:`course_lib.debugging.measure.drift_run`."""
    lines = [f"cause: {cause}"]
    for step, found in enumerate(seen):
        when = "before training" if step == 0 else f"after step {step}"
        lines.append(f"  {when:16} " + ("all ranks identical" if found is None else
                                        f"first difference: {found[0]} (rank(s) {found[1]})"))
    return "\n".join(lines)


@legible
def plot_step_times(rows: list, slow_rank: int | None = None):
    """Compute and whole-step time per rank per step: the straggler's own time is compute."""
    fig, axes = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI, sharey=True)
    n = len(rows[0][0])
    for ax, k, title in ((axes[0], 0, "compute (forward + backward)"),
                         (axes[1], 1, "whole step (with the all-reduce)")):
        for r in range(n):
            ax.plot([row[k][r] * 1e3 for row in rows], marker="o", color=PALETTE[r % len(PALETTE)],
                    label=f"rank {r}" + (" (slowed)" if r == slow_rank else ""))
        ax.set(title=title, xlabel="step")
    axes[0].set_ylabel("ms")
    axes[0].legend()
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value
    return fig


def drift_widget():
    """A dropdown over the ways ranks drift apart: each choice runs 2 real ranks and prints what
    the divergence checker found after every step (:func:`format_drift`)."""
    import ipywidgets as widgets

    def show(cause: str = "buffer", steps: int = 2) -> None:
        print(format_drift(cause, drift_run(cause, steps=steps)))

    return widgets.interactive(
        show, cause=widgets.Dropdown(options=list(CAUSES), value="buffer", description="cause",
                                     style=WIDGET_STYLE),
        steps=widgets.IntSlider(value=2, min=1, max=5, description="steps", style=WIDGET_STYLE))
