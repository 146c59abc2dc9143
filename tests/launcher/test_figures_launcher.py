"""Chapter 00's picture of one all-reduce, drawn from two real runs (2 and 4 ranks)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from course_lib import run  # noqa: E402
from course_lib.launcher.show import plot_all_reduce  # noqa: E402
from figure_checks import patches, texts, too_small  # noqa: E402


def _first_all_reduce():
    x = torch.tensor([dist.get_rank() + 1.0])
    before = x.item()
    dist.all_reduce(x)
    return before, x.item()


@pytest.mark.parametrize("world", [2, 4])
def test_one_box_per_rank_before_and_after_with_the_values_of_the_run(world):
    results = run(_first_all_reduce, world)
    fig = plot_all_reduce(results)
    assert len(patches(fig, "before-")) == len(patches(fig, "after-")) == world
    shown = {t.get_text() for t in texts(fig)}
    total = world * (world + 1) / 2
    for rank in range(world):
        assert f"rank {rank}: {rank + 1:g}" in shown and f"rank {rank}: {total:g}" in shown
    assert any(f"world size {world}" in s for s in shown)
    assert not too_small(fig)
    plt.close(fig)


def test_nothing_to_draw_is_a_clear_error():
    with pytest.raises(ValueError, match="one \\(before, after\\) pair per rank"):
        plot_all_reduce([])
