"""Chapter 4's idealised schedule, laid out from the generator's order: two depths, two schedules."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.pipeline_parallel.measure import bubble_formula  # noqa: E402
from course_lib.pipeline_parallel.plots import ideal_timeline, plot_schedule  # noqa: E402
from course_lib.pipeline_parallel.schedules import schedule_ops  # noqa: E402
from figure_checks import patches, too_small  # noqa: E402


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_one_bar_per_operation_in_the_generators_order(schedule, p, m):
    fig = plot_schedule(schedule, p, m)
    assert len(patches(fig, "op-")) == 2 * m * p
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [f"stage {r}" for r in range(p)]
    for rank in range(p):
        bars = sorted(patches(fig, f"op-{rank}-"), key=lambda b: b.get_x())
        assert [b.get_gid() for b in bars] == [f"op-{rank}-{k}{i}"
                                                for k, i in schedule_ops(schedule, p, m, rank)]
    assert not too_small(fig)
    plt.close(fig)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 2)])
def test_the_ideal_bubble_is_the_formula_and_1f1b_holds_fewer(p, m):
    gpipe, ofob = ideal_timeline("gpipe", p, m), ideal_timeline("1f1b", p, m)
    for t in (gpipe, ofob):
        assert t["bubble"] == pytest.approx(bubble_formula(p, m))
    assert gpipe["in_flight"] == [m] * p
    assert ofob["in_flight"] == [min(p - r, m) for r in range(p)]


def test_an_order_that_deadlocks_or_misses_an_operation_is_an_error():
    def backward_first(schedule, p, m, rank):
        return [("B", i) for i in range(m)] + [("F", i) for i in range(m)]
    with pytest.raises(ValueError, match="deadlocks: rank 0 waits before \\('B', 0\\)"):
        ideal_timeline("mine", 2, 2, ops=backward_first)
    with pytest.raises(ValueError, match="rank 0's order must hold every"):
        ideal_timeline("mine", 2, 2, ops=lambda s, p, m, r: [("F", 0)])
