"""Every text of the course's measured figures is at least display.FONT_MIN points.

The figures are drawn from small fakes of the measured results they take (no launch: the
conceptual figures' own tests check their text on real runs); each is drawn the way a notebook
shows it, outside the function, so a tick label made at matplotlib's 10-pt default fails.
"""
from __future__ import annotations

from types import SimpleNamespace as NS

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.capstone import show as capstone  # noqa: E402
from course_lib.common.models import get_config  # noqa: E402
from course_lib.common.show import plot_timeline  # noqa: E402
from course_lib.common.timeline import Span  # noqa: E402
from course_lib.communicating_less.show import plot_hooks  # noqa: E402
from course_lib.communication import show as comm  # noqa: E402
from course_lib.communication.alphabeta import AlphaBeta  # noqa: E402
from course_lib.communication.benchmark import CollectiveResult  # noqa: E402
from course_lib.data_parallel.collectives import CollectiveDemo  # noqa: E402
from course_lib.data_parallel.show import plot_collectives, plot_memory_vs_world  # noqa: E402
from course_lib.debugging.show import plot_step_times  # noqa: E402
from course_lib.fault_tolerance.show import plot_checkpoint_cost, plot_waste  # noqa: E402
from course_lib.memory import show as memory  # noqa: E402
from course_lib.pipeline_parallel.show import plot_pipeline_gantt, plot_stash  # noqa: E402
from course_lib.pipeline_parallel.trace import StageTrace  # noqa: E402
from course_lib.sharding.show import plot_comm, plot_ranks, plot_strategies  # noqa: E402
from course_lib.tensor_parallel.show import plot_tp_bytes  # noqa: E402
from course_lib.display import FONT_MIN  # noqa: E402
from figure_checks import too_small  # noqa: E402

MIB = 2**20
_STATES = {"params": 4 * MIB, "grads": 4 * MIB, "optimizer": 8 * MIB}
_ALL = {**_STATES, "activations": 3 * MIB, "temporaries": MIB, "peak": 20 * MIB}


def _collectives():
    rows = [CollectiveResult(c, w, n, 1e-5 * w + n * 1e-9, 5, "gloo")
            for c in ("all_reduce", "all_gather") for w in (2, 4) for n in (2**10, 2**16, 2**20)]
    return rows, {w: AlphaBeta(1e-5, 1e-9) for w in (2, 4)}


def _scaling():
    return [NS(mode=mode, world=w, compute_s=0.01 / w, comm_s=0.002 * w, sync_s=0.003 * w,
               efficiency=1 / (1 + 0.1 * w))
            for mode in ("strong", "weak") for w in (1, 2, 4)]


def _links():
    return [NS(link=link, strategy=s, step_s=k * 0.01 * (2 if s == "fsdp" else 1),
               predicted_s=k * 0.011, sent_bytes=MIB * (1.5 if s == "fsdp" else 1))
            for k, link in enumerate(("unshaped", "1 Gbit/s", "100 Mbit/s"), 1)
            for s in ("ddp", "fsdp")]


def _pipeline(schedule: str):
    traces = [StageTrace(rank=r, events=[(k, i, 0.01 * (i + r + (4 if k == "B" else 0)),
                                          0.01 * (i + r + (4 if k == "B" else 0)) + 0.009)
                                         for k in "FB" for i in range(2)],
                         waits=[("F", 0, 0.0, 0.01)] if r else [],
                         stash_peak_count=2, stash_peak_bytes=MIB) for r in range(2)]
    return NS(p=2, m=2, schedule=schedule, traces=traces, span=0.08, bubble=0.3, formula=1 / 3)


FIGURES = {
    "busbw": lambda: comm.plot_busbw(_collectives()[0], ceiling_gbps=5.0),
    "fit": lambda: comm.plot_fit(*_collectives()),
    "alpha-beta": lambda: comm.plot_alpha_beta(_collectives()[1]),
    "scaling": lambda: comm.plot_scaling(_scaling()),
    "link sweep": lambda: comm.plot_link_sweep(_links()),
    "checkpoint cost": lambda: plot_checkpoint_cost(
        [{"model": m, "bytes": b, "save_s": b * 1e-9, "load_s": b * 2e-9}
         for m, b in (("tiny", 2e6), ("small", 2e7))]),
    "waste": lambda: plot_waste(30.0, 3600.0, 60.0, simulate=False),
    "stacked": lambda: memory.plot_stacked({"after forward": _ALL, "after backward": _STATES}),
    "measured vs predicted": lambda: memory.plot_measured_vs_predicted(_ALL, _ALL),
    "memory timeline": lambda: memory.plot_timeline(
        NS(timeline=[(f"{k} {phase}", _ALL) for k in (1, 2) for phase in ("forward", "backward", "step")],
           peak_breakdown=_ALL)),
    "activation scaling": lambda: memory.plot_scaling(
        {"batch size": ([1, 2, 4], [1e6, 2e6, 4e6], [1e6, 2e6, 4e6]),
         "sequence length (tokens)": ([16, 32], [1e6, 2.5e6], [1e6, 2.5e6])}),
    "recompute": lambda: memory.plot_recompute(
        get_config("tiny"), [{"recompute": m, "batch": 2, "seq_len": 64, "activations": 1e6,
                              "peak": 5e6} for m in ("none", "full")], batch_sizes=(1, 2)),
    "rank timeline": lambda: plot_timeline(
        [Span(r, lane, name, t, t + 0.01) for r in range(2)
         for lane, name, t in (("compute", "backward", 0.0), ("comm", "all_reduce 1", 0.005))]),
    "pipeline gantt": lambda: plot_pipeline_gantt(_pipeline("gpipe")),
    "stash": lambda: plot_stash({"gpipe": _pipeline("gpipe"), "1f1b": _pipeline("1f1b")}),
    "sharded ranks": lambda: plot_ranks([_STATES] * 2, [_STATES] * 2, "FSDP, 2 ranks"),
    "strategies": lambda: plot_strategies({"ddp": [_STATES], "fsdp": [_STATES]},
                                          {"ddp": [_STATES], "fsdp": [_STATES]}),
    "comm bytes": lambda: plot_comm({"ddp": {"all_reduce": MIB},
                                     "fsdp": {"all_gather": MIB, "reduce_scatter": MIB}}),
    "tp bytes": lambda: plot_tp_bytes([1, 2, 4], [4 * MIB, 2 * MIB, MIB], [MIB] * 3, [0, MIB, MIB]),
    "collectives": lambda: plot_collectives(
        [CollectiveDemo("all_reduce", 2, [[10.0, 11.0], [20.0, 21.0]], [[30.0, 32.0]] * 2),
         CollectiveDemo("broadcast", 2, [[10.0], [20.0]], [[10.0], [10.0]])]),
    "memory vs world": lambda: plot_memory_vs_world({1: _STATES, 2: _STATES}),
    "capstone curves": lambda: capstone.plot_curves(
        {"layout": {"dp": 1}, "losses": [3.0, 2.5, 2.2], "val_losses": [(3, 2.3)]},
        [{"layout": {"dp": 2}, "losses": [3.0, 2.5, 2.2], "val_losses": [(3, 2.3)]}]),
    "step times": lambda: plot_step_times([([0.01, 0.03], [0.031, 0.032])] * 3, slow_rank=1),
    "hooks": lambda: plot_hooks([{"hook": "allreduce", "sent": 8e5}, {"hook": "powerSGD", "sent": 4e4}],
                                {0: [{"hook": "allreduce", "step_s": 0.02},
                                     {"hook": "powerSGD", "step_s": 0.03}]}),
}


@pytest.mark.parametrize("name", FIGURES)
def test_no_text_below_the_floor(name):
    fig = FIGURES[name]()
    small = too_small(fig)
    plt.close(fig)
    assert not small, f"{name}: {small[:5]}"


def test_the_style_is_undone_and_nothing_else():
    """The wrapper restores its own keys only: a setting the function (or a backend activated
    by its first figure) changes stays, as the inline backend's interactive mode must."""
    from course_lib.common.plots import legible

    @legible
    def draw():
        matplotlib.rcParams["lines.linewidth"] = 7.0   # what a first figure's backend may set
        assert matplotlib.rcParams["font.size"] == FONT_MIN
        return plt.figure()

    before = matplotlib.rcParams["font.size"], matplotlib.rcParams["lines.linewidth"]
    try:
        plt.close(draw())
        assert matplotlib.rcParams["font.size"] == before[0]
        assert matplotlib.rcParams["lines.linewidth"] == 7.0
    finally:
        matplotlib.rcParams["lines.linewidth"] = before[1]


@pytest.mark.parametrize("name", [n for n in FIGURES if n in ("memory timeline",)])
def test_tick_labels_do_not_run_into_each_other(name):
    """Chapter 01's phases ("1 forward", "1 backward", ...) at 11 pt once printed as one word."""
    fig = FIGURES[name]()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    clashes = []
    for ax in fig.axes:
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.get_xticklabels()
                 if t.get_text() and t.get_visible()]
        clashes += [(a, b) for (a, p), (b, q) in zip(boxes, boxes[1:]) if p.overlaps(q)]
    plt.close(fig)
    assert not clashes, f"{name}: {clashes}"
