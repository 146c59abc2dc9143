"""Chapter 2's figures: the bucket picture from real buckets (two caps, two world sizes), and the
text sizes of the bucket timeline and the DP widget's panels (readable at the notebook's width)."""
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.common.models import GPT, get_config  # noqa: E402
from course_lib.data_parallel.buckets import make_buckets  # noqa: E402
from course_lib.data_parallel.show import plot_buckets, plot_dp_run, plot_gradient_buckets  # noqa: E402
from figure_checks import patches, texts, too_small  # noqa: E402


def _comparison(world, cap_bytes):
    params = [p for p in GPT(get_config("tiny")).parameters() if p.requires_grad]
    buckets = make_buckets(params, cap_bytes)
    layout = [(len(b), sum(p.numel() * p.element_size() for p in b)) for b in buckets]
    launches, produced = [], 0
    for i, (n, _) in enumerate(layout):
        produced += n
        launches.append((i, produced))
    return SimpleNamespace(world=world, buckets=layout, launches=launches, n_grads=produced,
                           cap_bytes=cap_bytes)


@pytest.mark.parametrize("world,cap", [(2, 160 * 2**10), (4, 64 * 2**10)])
def test_one_segment_per_bucket_and_rank_sized_by_its_bytes(world, cap):
    comparison = _comparison(world, cap)
    fig = plot_gradient_buckets(comparison)
    n = len(comparison.buckets)
    assert len(patches(fig, "bucket-")) == world * n
    for rank in range(world):
        widths = [p.get_width() for p in patches(fig, f"bucket-{rank}-")]
        assert widths == pytest.approx([b / 2**10 for _, b in comparison.buckets])
    shown = [t.get_text() for t in texts(fig)]
    assert sum(s.startswith("rank ") for s in shown) == world
    assert any(f"after {comparison.n_grads}/{comparison.n_grads} grads" in s for s in shown)
    assert not too_small(fig)
    plt.close(fig)


def test_the_two_caps_cut_different_buckets():
    assert len(_comparison(2, 160 * 2**10).buckets) < len(_comparison(2, 64 * 2**10).buckets)


def test_the_bucket_timeline_and_the_widget_panels_are_readable():
    buckets = [{"ready_ms": 1.0 + i, "done_ms": 3.0 + i, "nbytes": 2**20, "n_tensors": 10 + i}
               for i in range(4)]
    fig = plot_buckets(SimpleNamespace(buckets=buckets, backward_ms=7.0))
    assert not too_small(fig)
    assert "bucket 3: 1.00 MiB, 13 tensors" in [t.get_text() for t in texts(fig)]
    plt.close(fig)
    reports = [SimpleNamespace(rank=r, model_states=2**20, peak=3 * 2**20, step_ms=10.0 + r,
                               sent_bytes=2**19) for r in range(4)]
    fig = plot_dp_run(reports, expected_sent=2**19, budget_bytes=4 * 2**20)
    assert not too_small(fig)
    plt.close(fig)
