"""Interactive front-ends (ipywidgets) over plain functions that tests call directly.

Chapter 1 (``01_training_memory``): :func:`memory_explorer` measures one training step of a GPT
preset and predicts it; :func:`memory_widget` puts dropdowns in front of it. Later chapters add
their widgets here, each over a plain function.
"""
from __future__ import annotations

from course_lib import predict
from course_lib.memory import measure_step
from course_lib.memory_report import MemoryReport
from course_lib.models import PRESETS, get_config
from course_lib.plots import plot_measured_vs_predicted

__all__ = ["memory_explorer", "show_memory_explorer", "memory_widget"]

_INTERACTIVE = ("tiny", "small", "medium")


def memory_explorer(preset: str = "tiny", batch_size: int = 8, seq_len: int = 64,
                    precision: str = "fp32", optimizer: str = "adam",
                    attention: str = "sdpa") -> tuple[MemoryReport, dict[str, int]]:
    """Measure two real training steps of a preset and predict them: ``(report, predicted)``."""
    config = get_config(preset).replace(attention=attention)
    report = measure_step(config, (batch_size, seq_len), precision=precision, optimizer=optimizer)
    return report, predict.predict_step(config, batch_size, seq_len, precision, optimizer)


def show_memory_explorer(preset: str = "tiny", batch_size: int = 8, seq_len: int = 64,
                         precision: str = "fp32", optimizer: str = "adam",
                         attention: str = "sdpa") -> None:
    """Print the measured-vs-predicted table of :func:`memory_explorer` and draw its bars."""
    import matplotlib.pyplot as plt

    try:
        report, predicted = memory_explorer(preset, batch_size, seq_len, precision, optimizer, attention)
    except (ValueError, MemoryError) as err:  # e.g. seq_len longer than the preset allows
        print(f"{type(err).__name__}: {err}")
        return
    print(report.table(predicted))
    plot_measured_vs_predicted(report, predicted, title=f"{preset}, {precision}, {optimizer}: "
                               f"batch {batch_size} × {seq_len} tokens")
    plt.show()


def memory_widget():
    """Dropdowns and sliders over :func:`show_memory_explorer`; each change runs a measurement."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    return w.interactive(
        show_memory_explorer,
        preset=w.Dropdown(options=[p for p in PRESETS if p in _INTERACTIVE], value="tiny", style=style),
        batch_size=w.Dropdown(options=[1, 2, 4, 8, 16, 32], value=8, style=style),
        seq_len=w.Dropdown(options=[16, 32, 64, 128, 256], value=64, style=style),
        precision=w.Dropdown(options=list(predict.PRECISIONS), value="fp32", style=style),
        optimizer=w.Dropdown(options=list(predict.OPTIMIZERS), value="adam", style=style),
        attention=w.Dropdown(options=["sdpa", "explicit"], value="sdpa", style=style),
    )
