"""Chapter 12's tables, figure and widget: predicted next to measured, curves that coincide."""
from __future__ import annotations

from course_lib.display import DPI, FIGSIZE, FONT_MIN, WIDGET_STYLE
from course_lib.common.plots import legible

__all__ = ["format_side_by_side", "format_speed", "curve_gap", "format_curves", "plot_curves", "train_widget"]


def _name(layout: dict) -> str:
    return " × ".join(f"{k} {v}" for k, v in layout.items()) or "one process"


def format_side_by_side(results: list[dict]) -> str:
    """Per layout and rank: predicted and measured model-state MB; then speed and MFU."""
    lines = [f"{'layout':22} {'rank':>4} {'stage':>5} {'predicted MB':>12} {'measured MB':>11} "
             f"{'diff':>6}"]
    for r in results:
        for rank in r["ranks"]:
            p = rank["bytes_predicted"]["model_states"]
            m = rank["bytes_measured"]["model_states"]
            stage = "-" if rank["stage"] is None else str(rank["stage"])
            lines.append(f"{_name(r['layout']):22} {rank['rank']:4d} {stage:>5} {p / 1e6:12.3f} "
                         f"{m / 1e6:11.3f} {abs(m - p) / p:6.1%}")
    return "\n".join(lines)


def format_speed(results: list[dict]) -> str:
    """Tokens per second, median step time and MFU of each run (times: this machine, now)."""
    lines = [f"{'layout':22} {'ranks':>5} {'tokens/s':>9} {'step ms':>8} {'MFU':>6}"]
    for r in results:
        lines.append(f"{_name(r['layout']):22} {r['world']:5d} {r['tokens_per_s']:9.0f} "
                     f"{r['step_seconds'] * 1e3:8.1f} {r['mfu']:6.1%}")
    return "\n".join(lines)


def curve_gap(reference: dict, result: dict) -> tuple[float, float]:
    """The largest difference of ``result``'s train losses from ``reference``'s over their
    common steps, and of its validation losses at the steps both evaluated."""
    n = min(len(result["losses"]), len(reference["losses"]))
    train = max(abs(a - b) for a, b in zip(result["losses"][:n], reference["losses"][:n]))
    ref_val = {s: v for s, v in reference["val_losses"]}
    val = max((abs(v - ref_val[s]) for s, v in result["val_losses"] if s in ref_val), default=0.0)
    return train, val


def format_curves(reference: dict, results: list[dict], tolerance: float = 1e-4) -> str:
    """Per run: are its train and val losses within ``tolerance`` of ``reference``'s?"""
    lines = []
    for r in results:
        gap = max(curve_gap(reference, r))
        lines.append(f"{_name(r['layout']):22} train and val within {tolerance:.0e} of "
                     f"{_name(reference['layout'])}: {gap < tolerance}")
    return "\n".join(lines)


@legible
def plot_curves(reference: dict, results: list[dict], steps: int | None = None):
    """Training loss per step (lines) and validation loss (markers) of ``reference`` and each
    run, over their first ``steps`` steps."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    steps = steps or len(reference["losses"])
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 2))]
    for i, r in enumerate([reference, *results]):
        n = min(steps, len(r["losses"]))
        line, = ax.plot(range(1, n + 1), r["losses"][:n], linestyle=styles[i % len(styles)],
                        label=f"{_name(r['layout'])} (train)")
        val = [(s, v) for s, v in r["val_losses"] if s <= steps]
        ax.plot(*zip(*val), "o", markersize=7 - i, fillstyle="none", color=line.get_color())
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title("train (lines) and validation (circles) loss:\nevery layout on one curve")
    ax.legend(fontsize=FONT_MIN)
    fig.tight_layout()
    return fig


def train_widget():
    """Choose a layout and a preset: the prediction at once; tick ``train`` to run it for real
    (a few steps on real ranks) and read predicted and measured side by side."""
    import ipywidgets as widgets

    from course_lib.capstone.measure import LAYOUTS, predict_run, train_gpt

    names = {_name(layout): layout for layout in LAYOUTS}

    def show(layout: str = "dp_shard 2 × tp 2", preset: str = "tiny", steps: int = 10,
             train: bool = False) -> None:
        p = predict_run(names[layout], preset)
        per_rank = ", ".join(f"{b['model_states'] / 1e6:.2f}" for b in p["bytes_predicted"])
        print(f"{layout}, preset {preset}: {p['world']} rank(s); predicted model states per rank "
              f"(MB): {per_rank}; {p['flops_per_step'] / 1e9:.2f} GFLOP per step")
        if train:
            r = train_gpt(names[layout], preset=preset, steps=steps, eval_every=steps)
            print(format_side_by_side([r]))
            print(format_speed([r]))
            print(f"loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}")

    return widgets.interactive(
        show, layout=widgets.Dropdown(options=list(names), value="dp_shard 2 × tp 2",
                                      style=WIDGET_STYLE),
        preset=widgets.Dropdown(options=["tiny", "small"], value="tiny", style=WIDGET_STYLE),
        steps=widgets.IntSlider(value=10, min=2, max=50,
                                style=WIDGET_STYLE), train=widgets.Checkbox(value=False, style=WIDGET_STYLE))

