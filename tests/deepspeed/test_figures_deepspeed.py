"""Chapter 08's holdings figure draws the bytes it is given, per stage and rank: N = 2 and N = 4
give 2 and 4 bars per stage, and each bar's segments add up to that rank's census total.

The objects here are the course's prediction laid out like a census result (a DeepSpeed run on
4 ranks costs tens of seconds); ``test_deepspeed.py`` draws the real census of its 2-rank run."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from course_lib.deepspeed.holdings import predict_deepspeed
from course_lib.deepspeed.show import plot_stage_holdings
from course_lib.sharding.formulas import param_shapes
from figure_checks import too_small  # noqa: E402


def predicted_result(world: int) -> dict:
    shapes = param_shapes("tiny")
    return {"ranks": [{"world_size": world, **{
        stage: {"after_backward": predict_deepspeed(shapes, stage, world, rank=r, moment="backward"),
                "after_step": predict_deepspeed(shapes, stage, world, rank=r)}
        for stage in range(4)}} for r in range(world)]}


def bar_totals(fig) -> list[list[float]]:
    """Per panel, per rank: the top of its stacked bar (MB)."""
    out = []
    for ax in fig.axes:
        tops: dict[float, float] = {}
        for bar in ax.patches:
            x = round(bar.get_x() + bar.get_width() / 2, 6)
            tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
        out.append([tops[x] for x in sorted(tops)])
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_one_bar_per_rank_per_stage_summing_to_the_census(world):
    result = predicted_result(world)
    fig = plot_stage_holdings(result)
    assert not too_small(fig)
    assert len(fig.axes) == 4
    for stage, totals in enumerate(bar_totals(fig)):
        assert len(totals) == world
        want = [r[stage]["after_backward"]["model_states"] / 1e6 for r in result["ranks"]]
        assert totals == pytest.approx(want)


def test_stage_3_shrinks_with_world_and_stage_0_does_not():
    two, four = (bar_totals(plot_stage_holdings(predicted_result(w))) for w in (2, 4))
    assert two[0][0] == pytest.approx(four[0][0])       # DDP: everything on every rank
    assert four[3][0] < 0.6 * two[3][0]                  # ZeRO-3: about halves again
