"""Chapter 12's tables, figure and widget: predicted next to measured, curves that coincide;
chapter 00's whole game (one process and two ranks on one curve) and the map of strategies."""
from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

from course_lib.composition.layout import Layout
from course_lib.display import DPI, FIGSIZE, FONT_MIN, WIDGET_STYLE
from course_lib.common.plots import legible

__all__ = ["STRATEGIES", "plot_strategy_map", "plot_whole_game", "format_side_by_side", "format_speed", "step_verdict", "explain_step", "plan_table", "curve_gap", "format_curves",
           "plot_curves", "train_widget", "STEP_RATIO_SEEN"]

#: measured / predicted step time seen on this project's 2-core machine (tiny and small presets,
#: every layout; x3.5 idle, up to x100 busy): a record, not a range any machine keeps to, so
#: :func:`step_verdict` compares with it only when asked
STEP_RATIO_SEEN = (3, 100)


#: The map chapter 00 draws: each strategy, what it splits over the ranks, what that saves, what
#: it costs in communication per training step (Ψ: the number of parameters; bytes as k·Ψ B, fp32),
#: and where the course teaches it. An all-reduce is a reduce-scatter plus an all-gather of the
#: same tensor, so ZeRO-1/2 send what DDP sends; ZeRO-3 (FSDP) all-gathers the parameters twice,
#: three half-all-reduces against DDP's two halves: 1.5× (the ZeRO paper, section 7).
STRATEGIES = (
    {"name": "Data parallel (DDP)", "splits": "the batch",
     "saves": "time: N ranks share\nevery batch",
     "costs": "all-reduce of the 4Ψ B of\ngradients, overlapped with backward", "chapter": "02"},
    {"name": "ZeRO-1 / ZeRO-2", "splits": "the batch; optimizer states\n(ZeRO-2: + gradients)",
     "saves": "optimizer states\n(+ gradients) ÷ N",
     "costs": "reduce-scatter grads, all-gather\nparams: as much as DDP",
     "chapter": "03, 08"},
    {"name": "ZeRO-3 / FSDP", "splits": "the batch; parameters,\ngradients, optimizer states",
     "saves": "model states ÷ N",
     "costs": "all-gather params twice, reduce-\nscatter grads: ≈ 1.5× DDP",
     "chapter": "03, 08"},
    {"name": "Tensor parallel", "splits": "each layer's matrices",
     "saves": "weights and a layer's\nactivations ÷ N",
     "costs": "all-reduce of activations inside\nevery block: fast links only", "chapter": "04"},
    {"name": "Pipeline parallel", "splits": "the layers into stages", "saves": "weights ÷ stages",
     "costs": "small sends between stages;\nidle bubble", "chapter": "04"},
    {"name": "Context parallel", "splits": "the sequence", "saves": "long sequences' activations",
     "costs": "keys and values passed\naround a ring", "chapter": "09"},
    {"name": "Expert parallel", "splits": "the experts of an MoE layer",
     "saves": "expert weights ÷ N",
     "costs": "all-to-all of tokens into\nand out of every MoE layer", "chapter": "09"},
)


@legible
def plot_strategy_map(strategies: tuple[dict, ...] = STRATEGIES):
    """One row per strategy: what it splits, what it saves, what it costs, its chapter."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    from course_lib.display import PALETTE, ink

    columns = [("splits", "splits over N ranks"), ("saves", "saves"),
               ("costs", "costs in communication")]
    widths = (2.2, 2.6, 2.4, 3.3)
    x0 = [sum(widths[:j]) for j in range(len(widths))]  # each column's left edge
    rows = len(strategies)
    fig, ax = plt.subplots(figsize=(10.5, 0.62 * rows + 1.2), dpi=DPI)
    for j, (_, title) in enumerate([("name", "strategy (chapter)"), *columns]):
        ax.text(x0[j] + 0.08, rows + 0.15, title, fontsize=FONT_MIN + 1, weight="bold", va="bottom")
    for i, s in enumerate(strategies):
        y = rows - 1 - i
        colour = PALETTE[i % len(PALETTE)]
        ax.add_patch(FancyBboxPatch((x0[0] + 0.04, y + 0.08), widths[0] - 0.08, 0.84,
                                    boxstyle="round,pad=0,rounding_size=0.08", color=colour))
        ax.text(x0[0] + widths[0] / 2, y + 0.5, f"{s['name']}\nchapter {s['chapter']}",
                ha="center", va="center", color=ink(colour), fontsize=FONT_MIN, weight="bold")
        for j, (key, _) in enumerate(columns, start=1):
            ax.add_patch(FancyBboxPatch((x0[j] + 0.04, y + 0.08), widths[j] - 0.08, 0.84,
                                        boxstyle="round,pad=0,rounding_size=0.08",
                                        facecolor="#f4f4f4", edgecolor=colour))
            ax.text(x0[j] + 0.12, y + 0.5, s[key], va="center", fontsize=FONT_MIN)
    ax.text(0.08, -0.1, "Ψ: the number of parameters. Chapter 09 combines the rows; chapter 12 "
            "trains the GPT on each.", va="top", fontsize=FONT_MIN)
    ax.set(xlim=(0, sum(widths)), ylim=(-0.5, rows + 0.7))
    ax.axis("off")
    fig.tight_layout()
    return fig


@legible
def plot_whole_game(one: dict, two: dict):
    """The loss per step of one process and of two DDP ranks, on one figure."""
    import matplotlib.pyplot as plt

    gap = max(abs(a - b) for a, b in zip(one["losses"], two["losses"]))
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    steps = range(1, len(one["losses"]) + 1)
    ax.plot(steps, one["losses"], linewidth=4, alpha=0.5, label="one process")
    ax.plot(steps, two["losses"], "--", linewidth=1.5, label="two ranks, torch's DDP")
    ax.set(xlabel="step", ylabel="loss (nats per byte)",
           title=f"the same GPT, the same batches: one curve (largest gap {gap:.0e})")
    ax.legend()
    fig.tight_layout()
    return fig


def _typed(result) -> object:
    """A :class:`~course_lib.capstone.measure.TrainReport` as it is; an older result dict (a
    learner's, a stored one) read by attribute, its layout parsed."""
    if isinstance(result, Mapping):
        fields = {**result, "layout": Layout.parse(result.get("layout"), ranks=None)}
        return SimpleNamespace(**fields)
    return result


def format_side_by_side(results: list) -> str:
    """Per layout and rank: predicted and measured model-state MB, then peak MB."""
    lines = [f"{'layout':22} {'rank':>4} {'stage':>5} {'states: predicted MB':>20} "
             f"{'measured':>8} {'diff':>6} {'peak: predicted MB':>18} {'measured':>8} {'diff':>6}"]
    for r in map(_typed, results):
        for rank in r.ranks:
            p = rank.bytes_predicted["model_states"]
            m = rank.bytes_measured["model_states"]
            pp, mp = rank.peak_predicted, rank.peak_measured
            peak = (f"{pp / 1e6:18.3f} {mp / 1e6:8.3f} {(mp - pp) / pp:+6.1%}" if mp and pp
                    else f"{'-':>18} {'-':>8} {'':>6}")
            stage = "-" if rank.stage is None else str(rank.stage)
            lines.append(f"{r.layout.label():22} {rank.rank:4d} {stage:>5} {p / 1e6:20.3f} "
                         f"{m / 1e6:8.3f} {abs(m - p) / p:6.1%} {peak}")
    return "\n".join(lines)


def format_speed(results: list) -> str:
    """Tokens per second, predicted and measured median step time, their ratio and MFU of each
    run (times: this machine, now)."""
    lines = [f"{'layout':22} {'ranks':>5} {'tokens/s':>9} {'predicted ms':>12} {'step ms':>8} "
             f"{'ratio':>6} {'MFU':>6}"]
    for r in map(_typed, results):
        step = getattr(r, "step_predicted", None)
        predicted = step["step_s"] * 1e3 if step else float("nan")
        lines.append(f"{r.layout.label():22} {r.world:5d} {r.tokens_per_s:9.0f} "
                     f"{predicted:12.2f} {r.step_seconds * 1e3:8.1f} "
                     f"{getattr(r, 'step_ratio', float('nan')):6.1f} {r.mfu:6.1%}")
    return "\n".join(lines)


def step_verdict(result, seen: tuple[float, float] | None = None) -> str:
    """Which way the step-time prediction erred, and by how much, from the measurement; with
    ``seen`` (e.g. :data:`STEP_RATIO_SEEN`) also whether the ratio lies in that range."""
    result = _typed(result)
    ratio, t = result.step_ratio, result.step_predicted
    way = "slower than predicted" if ratio >= 1 else "faster than predicted"
    line = (f"{result.layout.label()}: predicted {t['step_s'] * 1e3:.2f} ms (compute "
            f"{t['compute_s'] * 1e3:.2f} + communication {t['comm_s'] * 1e3:.2f}), measured "
            f"{result.step_seconds * 1e3:.1f} ms: x{ratio:.1f}, {way}")
    if seen is not None:
        line += f"; within x{seen[0]:g}-x{seen[1]:g} (seen before): {seen[0] <= ratio <= seen[1]}"
    return line


def explain_step(result, shares) -> str:
    """The step-time prediction set beside where the measured step went: ``shares``
    (:func:`course_lib.capstone.trace.step_shares` of one profiled step of rank 0) scaled to the
    median step. The prediction has two terms, the step's matmuls at the measured matmul rate
    and the collectives' α-β time; the rest of the measured step is what it leaves out."""
    result = _typed(result)
    t, step = result.step_predicted, result.step_seconds

    def ms(category: str) -> float:
        return shares.share(category) * step * 1e3
    left_out = ms("other ops") + ms("optimizer") + ms("Python and launch")
    return "\n".join([
        f"{'':28} {'predicted ms':>12} {'measured ms':>12}",
        f"{'matmuls':28} {t['compute_s'] * 1e3:12.1f} {ms('matmul'):12.1f}",
        f"{'communication':28} {t['comm_s'] * 1e3:12.1f} {ms('communication'):12.1f}",
        f"{'other ops, optimizer, Python':28} {'not counted':>12} {left_out:12.1f}",
        f"{'step':28} {t['step_s'] * 1e3:12.1f} {step * 1e3:12.1f}",
        f"the two terms the prediction counts take {(ms('matmul') + ms('communication')) / 1e3 / step:.0%} "
        f"of the measured step; what it leaves out, {left_out / 1e3 / step:.0%}"])


def plan_table(plan) -> str:
    """A planner's rows in the order of their labels (not best first: choosing is the
    exercise): fits, GiB per GPU with the margin, tokens/s per GPU, MFU."""
    lines = [f"{plan.model.name}: {plan.gpus} × {plan.cluster.name}, global batch "
             f"{plan.global_batch} × {plan.seq_len} tokens",
             f"{'layout':34} {'fits':>4} {'GiB/GPU':>8} {'tok/s/GPU':>10} {'MFU':>6}"]
    for r in sorted(plan.rows, key=lambda r: r.label):
        lines.append(f"{r.label:34} {'yes' if r.fits else 'no':>4} {r.need_gib:8.1f} "
                     f"{r.tokens_per_s_gpu:10,.0f} {r.mfu:6.1%}")
    return "\n".join(lines)


def curve_gap(reference, result) -> tuple[float, float]:
    """The largest difference of ``result``'s train losses from ``reference``'s over their
    common steps, and of its validation losses at the steps both evaluated."""
    reference, result = _typed(reference), _typed(result)
    n = min(len(result.losses), len(reference.losses))
    train = max(abs(a - b) for a, b in zip(result.losses[:n], reference.losses[:n]))
    ref_val = {s: v for s, v in reference.val_losses}
    val = max((abs(v - ref_val[s]) for s, v in result.val_losses if s in ref_val), default=0.0)
    return train, val


def format_curves(reference, results: list, tolerance: float = 1e-4) -> str:
    """Per run: are its train and val losses within ``tolerance`` of ``reference``'s?"""
    lines = []
    for r in map(_typed, results):
        gap = max(curve_gap(reference, r))
        lines.append(f"{r.layout.label():22} train and val within {tolerance:.0e} of "
                     f"{_typed(reference).layout.label()}: {gap < tolerance}")
    return "\n".join(lines)


@legible
def plot_curves(reference, results: list, steps: int | None = None):
    """Training loss per step (lines) and validation loss (markers) of ``reference`` and each
    run, over their first ``steps`` steps."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    runs = [_typed(r) for r in (reference, *results)]
    steps = steps or len(runs[0].losses)
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 2))]
    for i, r in enumerate(runs):
        n = min(steps, len(r.losses))
        line, = ax.plot(range(1, n + 1), r.losses[:n], linestyle=styles[i % len(styles)],
                        label=f"{r.layout.label()} (train)")
        val = [(s, v) for s, v in r.val_losses if s <= steps]
        ax.plot(*zip(*val), "o", markersize=7 - i, fillstyle="none", color=line.get_color())
    ax.set(xlabel="step", ylabel="loss (nats per byte)",
           title="train (lines) and validation (circles) loss:\nevery layout on one curve")
    ax.legend(fontsize=FONT_MIN)
    fig.tight_layout()
    return fig


def train_widget():
    """Choose a layout and a preset: the prediction at once; tick ``train`` to run it for real
    (a few steps on real ranks) and read predicted and measured side by side."""
    import ipywidgets as widgets

    from course_lib.capstone.measure import LAYOUTS, predict_run, train_gpt

    names = {Layout.parse(layout, ranks=None).label(): layout for layout in LAYOUTS}

    def show(layout: str = "dp_shard 2 × tp 2", preset: str = "tiny", steps: int = 10,
             train: bool = False) -> None:
        p = predict_run(names[layout], preset)
        per_rank = ", ".join(f"{b['model_states'] / 1e6:.2f}" for b in p.bytes_predicted)
        print(f"{layout}, preset {preset}: {p.world} rank(s); predicted model states per rank "
              f"(MB): {per_rank}; {p.flops_per_step / 1e9:.2f} GFLOP per step")
        if train:
            r = train_gpt(names[layout], preset=preset, steps=steps, eval_every=steps)
            print(format_side_by_side([r]))
            print(format_speed([r]))
            print(step_verdict(r))
            print(f"loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}")

    return widgets.interactive(
        show, layout=widgets.Dropdown(options=list(names), value="dp_shard 2 × tp 2",
                                      style=WIDGET_STYLE),
        preset=widgets.Dropdown(options=["tiny", "small"], value="tiny", style=WIDGET_STYLE),
        steps=widgets.IntSlider(value=10, min=2, max=50,
                                style=WIDGET_STYLE), train=widgets.Checkbox(value=False, style=WIDGET_STYLE))

