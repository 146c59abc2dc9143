"""Chapter 7's widget over :func:`course_lib.finetuning.planner.plan` (tests call ``plan``).

Each widget keeps its own cache of fake-tensor measurements, so a setting seen before answers at
once; a new one costs fake-tensor runs (seconds for the tiny preset, tens of seconds for
``gpt-7b``'s layer slices).
"""
from __future__ import annotations

import ipywidgets as widgets
from IPython.display import display

from course_lib.finetuning.planner import plan

__all__ = ["planner_widget"]

_MODELS = ("tiny", "small", "medium", "gpt-7b")


def planner_widget(model: str = "tiny", gpu_memory_gb: float = 80, n_gpus: int = 8,
                   seq_len: int = 64, micro_batch: int = 1, r: int = 16,
                   cache: dict | None = None) -> widgets.VBox:
    """Dropdowns for model, GPU memory, GPU count, sequence length, micro-batch and LoRA rank;
    press "Plan" to measure (fake tensors) and print the table. ``cache``: measurements to reuse
    (e.g. the dict an earlier :func:`~course_lib.finetuning.planner.plan` call filled)."""
    cache = {} if cache is None else cache
    w_model = widgets.Dropdown(options=_MODELS, value=model, description="model")
    w_mem = widgets.Dropdown(options=[16, 24, 40, 48, 80, 141], value=gpu_memory_gb, description="GPU GB")
    w_gpus = widgets.Dropdown(options=[1, 2, 4, 8, 16, 32], value=n_gpus, description="GPUs")
    w_seq = widgets.Dropdown(options=[64, 128, 256, 512, 1024, 2048, 4096, 8192], value=seq_len,
                             description="seq len")
    w_mb = widgets.Dropdown(options=[1, 2, 4, 8], value=micro_batch, description="micro-batch")
    w_r = widgets.Dropdown(options=[4, 8, 16, 64], value=r, description="LoRA r")
    button = widgets.Button(description="Plan", button_style="primary")
    out = widgets.Output()

    def _run(_=None) -> None:
        out.clear_output()
        with out:
            if w_model.value == "gpt-7b":
                print("measuring 7B slices on fake tensors: ~10-30 s ...")
            try:
                print(plan(w_model.value, gpu_memory_gb=w_mem.value, n_gpus=w_gpus.value,
                           seq_len=w_seq.value, micro_batch=w_mb.value, r=w_r.value, cache=cache))
            except (ValueError, MemoryError) as err:
                print(f"cannot plan this: {err}")

    button.on_click(_run)
    box = widgets.VBox([widgets.HBox([w_model, w_mem, w_gpus]), widgets.HBox([w_seq, w_mb, w_r]),
                        button, out])
    _run()
    return box


if __name__ == "__main__":  # pragma: no cover - manual check
    display(planner_widget())
