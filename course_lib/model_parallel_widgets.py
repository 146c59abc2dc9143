"""Chapter 4 explorers: plain functions (tests call them) and ipywidgets front-ends over them.

* :func:`pipeline_explorer` — stages × micro-batches × schedule → a real run on ``p``
  processes, its Gantt chart and the measured bubble beside ``(p-1)/(m+p-1)``;
* :func:`tp_explorer` — tensor-parallel degree → per-rank parameter bytes and bytes all-reduced,
  measured on a real run of the whole GPT.
"""
from __future__ import annotations

from course_lib.model_parallel_plots import plot_pipeline_gantt
from course_lib.models import GPTConfig, get_config
from course_lib.pipeline import SCHEDULES
from course_lib.pipeline_measure import BUBBLE_CONFIG, PipelineReport, measure_pipeline
from course_lib.tp_check import measure_tp_model

__all__ = ["pipeline_explorer", "pipeline_widget", "tp_explorer", "format_tp", "tp_widget",
           "side_by_side"]


def side_by_side(left: object, right: object, titles: tuple[str, str] = ("", "")):
    """Two objects' source code (read with ``inspect``, never copied) in two HTML columns."""
    import html
    import inspect

    from IPython.display import HTML

    cells = "".join(
        f"<td style='vertical-align:top;text-align:left'><b>{html.escape(title)}</b>"
        f"<pre style='font-size:11px'>{html.escape(inspect.getsource(obj))}</pre></td>"
        for title, obj in zip(titles, (left, right)))
    return HTML(f"<table><tr>{cells}</tr></table>")


def pipeline_explorer(p: int = 2, m: int = 4, schedule: str = "gpipe",
                      config: GPTConfig | str = BUBBLE_CONFIG, micro_batch: int = 2, steps: int = 1,
                      plot: bool = True) -> tuple[PipelineReport, object]:
    """Run the hand-written pipeline and return ``(report, figure or None)``.

    Defaults favour a quick answer (2 sequences per micro-batch, one recorded step); the
    chapter's bubble measurement uses :func:`measure_pipeline`'s larger defaults.
    """
    report = measure_pipeline(p, m, schedule, config, micro_batch=micro_batch, steps=steps)
    return report, (plot_pipeline_gantt(report) if plot else None)


def tp_explorer(t: int = 2, config: GPTConfig | str = "small", batch: int = 2) -> dict:
    """Measured per-rank parameter bytes and all-reduced bytes of a ``t``-way TP GPT (rank 0)."""
    config = get_config(config)
    r = measure_tp_model(t, config, batch)[0]
    return {"t": t, "dense_param_bytes": r.dense_param_bytes, "split_bytes": r.param_bytes["split"],
            "replicated_bytes": r.param_bytes["replicated"],
            "rank_param_bytes": r.param_bytes["split"] + r.param_bytes["replicated"],
            "forward_bytes": r.comm_bytes["forward"], "backward_bytes": r.comm_bytes["backward"],
            "all_reduces": r.comm_calls["forward"] + r.comm_calls["backward"],
            "expected_bytes": r.expected["forward"] + r.expected["backward"],
            "n_layer": config.n_layer, "loss_matches_dense": abs(r.loss - r.dense_loss) < 1e-4}


def format_tp(row: dict) -> str:
    """A few lines describing one :func:`tp_explorer` result."""
    kib = 2**10
    return (f"t={row['t']}: parameters per rank {row['rank_param_bytes'] / kib:,.0f} KiB "
            f"(split linears {row['split_bytes'] / kib:,.0f} KiB = dense linears / {row['t']}, "
            f"replicated LayerNorms/embeddings/head {row['replicated_bytes'] / kib:,.0f} KiB) "
            f"of {row['dense_param_bytes'] / kib:,.0f} KiB dense\n"
            f"all-reduced per step: forward {row['forward_bytes'] / kib:,.0f} KiB + backward "
            f"{row['backward_bytes'] / kib:,.0f} KiB in {row['all_reduces']} all-reduces "
            f"(expected 4 x b*s*h*4 B x {row['n_layer']} blocks = {row['expected_bytes'] / kib:,.0f} KiB); "
            f"loss equals dense: {row['loss_matches_dense']}")


def pipeline_widget():
    """Sliders for p and m and a schedule choice; each change runs a real pipeline."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    p = w.Dropdown(options=[1, 2, 4], value=2, description="stages p")
    m = w.IntSlider(value=4, min=1, max=12, description="micro-batches m")
    schedule = w.ToggleButtons(options=list(SCHEDULES), value="gpipe", description="schedule")
    out = w.Output()

    def show(_=None) -> None:
        with out:
            out.clear_output(wait=True)
            report, fig = pipeline_explorer(p.value, m.value, schedule.value)
            print(report.summary())
            display(fig)
            plt.close(fig)

    for control in (p, m, schedule):
        control.observe(show, names="value")
    show()
    return w.VBox([w.HBox([p, schedule]), m, out])


def tp_widget(config: GPTConfig | str = "small"):
    """A dropdown for the tensor-parallel degree; each change runs the TP GPT on t ranks."""
    import ipywidgets as w

    heads = get_config(config).n_head
    t = w.Dropdown(options=[d for d in (1, 2, 4, 8) if heads % d == 0], value=2,
                   description="TP degree t")
    out = w.Output()

    def show(_=None) -> None:
        with out:
            out.clear_output(wait=True)
            print(format_tp(tp_explorer(t.value, config)))

    t.observe(show, names="value")
    show()
    return w.VBox([t, out])
