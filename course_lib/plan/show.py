"""The planner's table as text, its figure (peak per GPU against tokens/s per GPU) and a widget."""
from __future__ import annotations

from course_lib.display import FIGSIZE, PALETTE
from course_lib.plan.models import STORED
from course_lib.plan.planner import plan, plan_text

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


def plan_widget(models=None, cache: dict | None = None, **defaults):
    """Model, GPUs, GPUs per node, memory per GPU, batch, sequence → the plan's table.

    Plans already computed come from ``cache`` at once; a new one shows its progress, layout by
    layout. ``models``: names or config.json paths (default: the stored configs).
    """
    import ipywidgets as w
    from IPython.display import display
    cache = {} if cache is None else cache
    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=list(models or STORED), description="model", style=style),
        "gpus": w.Dropdown(options=[8, 16, 32, 64, 128, 256, 512], value=defaults.get("gpus", 8),
                           description="GPUs", style=style),
        "gpus_per_node": w.Dropdown(options=[4, 8], value=8, description="GPUs/node", style=style),
        "memory_gib": w.Dropdown(options=[40.0, 79.6, 93.0, 95.0], value=defaults.get("memory_gib", 79.6),
                                 description="GiB/GPU", style=style),
        "global_batch": w.IntText(value=defaults.get("global_batch", 16), description="batch (seqs)",
                                  style=style),
        "seq_len": w.Dropdown(options=[2048, 4096, 8192, 16384, 32768],
                              value=defaults.get("seq_len", 8192), description="seq", style=style),
    }
    button, status, out = w.Button(description="Plan"), w.Label(), w.Output()

    def go(_=None):
        args = {k: c.value for k, c in controls.items()}
        key = tuple(sorted(args.items()))
        if key not in cache:
            def progress(i, n, label):
                status.value = f"measuring layout {i + 1} of {n}: {label}"
            try:
                cache[key] = plan(args.pop("model"), **args, progress=progress)
            except ValueError as err:
                status.value = f"error: {err}"
                return
        status.value = "done"
        out.clear_output()
        with out:
            print(plan_text(cache[key], top=10))

    button.on_click(go)
    box = w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:] + [button]),
                  status, out])
    display(box)
    return box
