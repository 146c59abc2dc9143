"""Chapter 09's figures are drawn from the objects beside them: two real DeviceMeshes give two
different pictures, torch's plans for 2 and 4 ranks give different rows and actions; the byte
verdict folds equal ranks into one line and names a rank that differs."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.patches import Rectangle

from course_lib.composition.mesh import show_meshes
from course_lib.composition.schedule_order import torch_schedule_order
from course_lib.composition.layout import Layout
from course_lib.composition.measure import ParallelReport, RankBytes
from course_lib.composition.show import bytes_summary, plot_mesh, plot_schedule_order
from figure_checks import too_small  # noqa: E402


@pytest.fixture(scope="module")
def meshes():
    return show_meshes(world=8, layouts={"2-D": ((2, 4), ("dp", "tp")),
                                         "3-D": ((2, 2, 2), ("pp", "dp_shard", "tp"))})


def _colour_of_rank(ax) -> dict[int, tuple]:
    """Rank number (the square's text) -> the square's face colour."""
    squares = [p for p in ax.patches if isinstance(p, Rectangle)]
    out = {}
    for text in ax.texts:
        x, y = text.get_position()
        square = next(s for s in squares if s.contains_point(ax.transData.transform((x, y))))
        out[int(text.get_text())] = square.get_facecolor()
    return out


def test_mesh_figure_has_one_panel_per_dimension_coloured_by_real_groups(meshes):
    for label, ranks in meshes.items():
        fig = plot_mesh(ranks)
        assert not too_small(fig)
        names = list(ranks[0]["dims"])
        axes = [ax for ax in fig.axes if ax.patches]
        assert len(axes) == len(names)
        for ax, name in zip(axes, names):
            colour = _colour_of_rank(ax)
            assert sorted(colour) == list(range(8))
            for r in ranks:   # same colour <=> same process group, as the rank read it
                for other in ranks:
                    same = r["dims"][name]["group_ranks"] == other["dims"][name]["group_ranks"]
                    assert (colour[r["rank"]] == colour[other["rank"]]) == same, (label, name)
    tp_2d = _colour_of_rank([a for a in plot_mesh(meshes["2-D"]).axes if a.patches][1])
    tp_3d = _colour_of_rank([a for a in plot_mesh(meshes["3-D"]).axes if a.patches][2])
    assert tp_2d[1] == tp_2d[2] and tp_3d[1] != tp_3d[2]   # tp groups of 4 vs of 2


@pytest.mark.parametrize("p", [2, 4])
def test_schedule_figure_draws_torchs_plan(p):
    orders = torch_schedule_order(("interleaved-1f1b", "zb-v"), p=p, m=2 * p)
    fig = plot_schedule_order(orders)
    assert not too_small(fig)
    axes = [ax for ax in fig.axes if ax.patches]
    assert len(axes) == 2
    for ax, order in zip(axes, orders.values()):
        assert len(ax.get_yticklabels()) == p
        actions = [a for acts in order.values() for a in acts if a is not None]
        assert len(ax.patches) == len(actions)
        assert [t.get_text() for t in ax.texts] == [a[len(a.rstrip("0123456789")):] for acts
                                                      in order.values() for a in acts if a]
    interleaved, zbv = (sorted({tuple(p.get_facecolor()[:3]) for p in ax.patches}) for ax in axes)
    assert len(interleaved) == 2 and len(zbv) == 3   # F, B vs F, I, W


def _report(*states):
    ranks = [RankBytes(r, *({"params": s, "grads": s, "optimizer": 2 * s, "model_states": 4 * s}
                            for _ in ("measured", "predicted")))
             for r, s in enumerate(states)]
    return ParallelReport(Layout(dp=len(states)), len(states), 0.0, 0.0, 1e-4, 1e-6, ranks)


def test_bytes_summary_folds_equal_ranks_and_names_a_difference():
    line, details = bytes_summary(_report(10, 10, 10, 10, 7, 7, 7, 7))
    assert line == ("all 8 ranks: measured == predicted (model states: ranks 0-3 40 B; "
                    "ranks 4-7 28 B)")
    assert details.count("<tr>") == 1 + 16 and details.startswith("<details>")
    broken = _report(10, 10)
    broken.ranks[1].bytes_measured = {**broken.ranks[1].bytes_measured, "grads": 11}
    assert bytes_summary(broken)[0].startswith("1 of 2 ranks differ: 1")


def test_schedule_order_refuses_before_any_process_starts():
    with pytest.raises(ValueError, match="single-stage"):
        torch_schedule_order(("gpipe",))
    with pytest.raises(ValueError, match="m >= p"):
        torch_schedule_order(p=4, m=2)
