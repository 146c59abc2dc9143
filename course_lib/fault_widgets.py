"""Chapter 6's widget: how often should a job of N GPUs checkpoint? (ipywidgets front-end)

:func:`show_interval` prints :func:`course_lib.checkpoint_interval.interval_summary` and draws
:func:`course_lib.fault_plots.plot_waste`; :func:`interval_widget` puts inputs in front of it.
Tests call the plain functions.
"""
from __future__ import annotations

from course_lib.checkpoint_interval import interval_summary
from course_lib.fault_plots import plot_waste

__all__ = ["format_interval", "show_interval", "interval_widget"]


def format_interval(n_gpus: int, failures_per_gpu_year: float, cost_s: float,
                    restart_s: float) -> str:
    """One paragraph: job MTBF, failures per day, Young/Daly interval, expected time lost."""
    s = interval_summary(n_gpus, failures_per_gpu_year, cost_s, restart_s)
    return (f"{n_gpus:,} GPUs at {failures_per_gpu_year:.3g} failures per GPU-year: a failure every "
            f"{s['mtbf_s'] / 3600:.2f} h ({s['failures_per_day']:.1f} per day)\n"
            f"checkpoint every √(2·C·M) = {s['interval_s'] / 60:.1f} min of work → "
            f"{100 * s['waste']:.1f} % of the time lost, {100 * s['effective']:.1f} % effective")


def show_interval(n_gpus: int = 16384, failures_per_gpu_year: float = 0.173,
                  cost_s: float = 30.0, restart_s: float = 120.0) -> None:
    """Print :func:`format_interval` and draw the lost-time curve (no simulation: instant)."""
    import matplotlib.pyplot as plt

    try:
        print(format_interval(n_gpus, failures_per_gpu_year, cost_s, restart_s))
    except ValueError as err:
        print(f"ValueError: {err}")
        return
    s = interval_summary(n_gpus, failures_per_gpu_year, cost_s, restart_s)
    plot_waste(cost_s, s["mtbf_s"], restart_s, simulate=False)
    plt.show()


def interval_widget():
    """Inputs for cluster size, per-GPU failure rate, checkpoint and restart cost."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    return w.interactive(
        show_interval,
        n_gpus=w.IntText(value=16384, description="GPUs", style=style),
        failures_per_gpu_year=w.FloatLogSlider(value=0.173, base=10, min=-3, max=1, step=0.05,
                                               description="failures per GPU-year", style=style),
        cost_s=w.FloatLogSlider(value=30, base=10, min=0, max=3.5, step=0.05,
                                description="checkpoint cost C (s)", style=style),
        restart_s=w.FloatSlider(value=120, min=0, max=1800, step=30,
                                description="restart cost R (s)", style=style),
    )
