"""The planner's table as text, its figure (peak per GPU against tokens/s per GPU) and a widget."""
from __future__ import annotations

from course_lib.display import FIGSIZE, PALETTE
from course_lib.plan.models import STORED, ConfigError
from course_lib.plan.planner import plan_text
from course_lib.plan.stored import stored_plan

__all__ = ["plot_plan", "compare_published", "plan_widget"]


def compare_published(row, published: dict) -> str:
    """One planned row beside a published run: memory and tokens/s/GPU, with the efficiency."""
    mem = row.need_gib
    return (f"{row.label}: planned {mem:.1f} GiB per GPU (tracked peak {row.peak_gib:.1f} GiB + "
            f"margin) vs published "
            f"{published['memory_gib']} GiB ({mem / published['memory_gib'] - 1:+.1%}); planned "
            f"{row.tokens_per_s_gpu:,.0f} tokens/s/GPU at the assumed efficiency vs published "
            f"{published['tokens_per_s_gpu']:,} ({published['source']})")


def plot_plan(p, ax=None):
    """Each layout as a point: peak GiB per GPU (x) against tokens/s per GPU (y); the memory line."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=FIGSIZE)
    colors = {"none": PALETTE[0], "selective": PALETTE[1], "full": PALETTE[2]}
    for ac, color in colors.items():
        rows = [r for r in p.rows if r.layout.ac == ac]
        if rows:
            ax.scatter([r.need_gib for r in rows], [r.tokens_per_s_gpu for r in rows], color=color,
                       label=f"AC {ac}", s=30)
    ax.axvline(p.cluster.memory_gib, color="black", linestyle="--", linewidth=1)
    if p.best:
        ax.annotate(p.best.label, (p.best.need_gib, p.best.tokens_per_s_gpu), fontsize=11,
                    xytext=(5, 5), textcoords="offset points")
    ax.set_xlabel("memory per GPU (GiB: fake-tensor peak + margin)")
    ax.set_ylabel("tokens/s per GPU (predicted)")
    ax.set_title(f"{p.model.name} on {p.gpus} GPUs")
    ax.legend()
    return ax


def plan_widget(models=None, **defaults):
    """Model (or a learner's config.json), GPUs, GPUs per node, memory per GPU, batch, sequence →
    the plan's table, best first.

    A stored table (``data/plans/``) or one planned earlier in this kernel answers at once
    (:func:`course_lib.plan.stored.stored_plan`); a new one is planned with a progress bar,
    layout by layout. ``models``: names (default: the stored configs); ``defaults``: the
    controls' starting values (``model``, ``gpus``, ``gpus_per_node``, ``memory_gib``,
    ``global_batch``, ``seq_len``).
    """
    import time

    import ipywidgets as w
    from IPython.display import display

    style = {"description_width": "initial"}
    names = list(models or STORED)
    controls = {
        "model": w.Dropdown(options=names, value=defaults.get("model", names[0]),
                            description="model", style=style),
        "gpus": w.Dropdown(options=[8, 16, 32, 64, 128, 256, 512], value=defaults.get("gpus", 8),
                           description="GPUs", style=style),
        "gpus_per_node": w.Dropdown(options=[4, 8], value=defaults.get("gpus_per_node", 8),
                                    description="GPUs/node", style=style),
        "memory_gib": w.Dropdown(options=[40.0, 79.6, 93.0, 95.0], value=defaults.get("memory_gib", 79.6),
                                 description="GiB/GPU", style=style),
        "global_batch": w.IntText(value=defaults.get("global_batch", 8), description="batch (seqs)",
                                  style=style),
        "seq_len": w.Dropdown(options=[2048, 4096, 8192, 16384, 32768],
                              value=defaults.get("seq_len", 8192), description="seq", style=style),
    }
    own = w.Text(value="", placeholder="or the path of your config.json", description="config",
                 style=style)
    button, bar, status, out = w.Button(description="Plan"), w.IntProgress(min=0, max=1), \
        w.Label(), w.Output()

    def go(_=None):
        args = {k: c.value for k, c in controls.items()}
        model = own.value.strip() or args.pop("model")
        args.pop("model", None)
        start = time.perf_counter()

        def progress(i, n, label):
            bar.max, bar.value = n, i
            status.value = f"measuring layout {i + 1} of {n} on fake tensors: {label}"
        try:
            p = stored_plan(model, progress=progress, **args)
        except (ConfigError, ValueError) as err:
            status.value = f"error: {err}"
            return
        bar.value = bar.max
        status.value = f"answered in {time.perf_counter() - start:.1f} s"
        out.clear_output()
        with out:
            print(plan_text(p, top=10))

    button.on_click(go)
    box = w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:]),
                  w.HBox([own, button]), w.HBox([bar, status]), out])
    display(box)
    go()
    return box
