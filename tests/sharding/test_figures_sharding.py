"""Chapter 3's pictures: ZeRO-0..3 holdings and FSDP's gather/free, from real runs on 2 and 4
ranks (each figure called on both; a hard-coded picture cannot match both)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib import zero  # noqa: E402
from course_lib.common.models import GPTConfig  # noqa: E402
from course_lib.sharding.holdings import zero_holdings  # noqa: E402
from course_lib.sharding.plots import plot_fsdp_gather_free, plot_zero_holdings  # noqa: E402
from figure_checks import patches, texts, too_small  # noqa: E402

CONFIG = GPTConfig(n_layer=2, n_head=2, d_model=32, vocab_size=64, seq_len=16)
DEEPER = CONFIG.replace(n_layer=3)


@pytest.fixture(scope="module")
def holdings():
    return {2: zero_holdings(2, CONFIG), 4: zero_holdings(4, DEEPER, stages=(1, 2, 3))}


def _width(fig, prefix):
    return sum(p.get_width() for p in patches(fig, prefix))


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_holds_its_share_per_stage(holdings, world):
    h = holdings[world]
    fig = plot_zero_holdings(h)
    for stage in h:
        for rank in range(world):
            shares = {c: _width(fig, f"hold-{stage}-{rank}-{c}") for c in ("params", "grads",
                                                                           "optimizer")}
            sharded = {0: (), 1: ("optimizer",), 2: ("grads", "optimizer"),
                       3: ("params", "grads", "optimizer")}[stage]
            for cat, share in shares.items():
                assert share == pytest.approx(1 / world if cat in sharded else 1, abs=0.02), \
                    (stage, rank, cat)
    ranks_shown = [t.get_text() for t in texts(fig) if t.get_text().startswith("rank ")]
    assert len(ranks_shown) == world * len(h)
    assert not too_small(fig)
    plt.close(fig)


@pytest.mark.parametrize("world", [2, 4])
def test_the_bytes_read_from_the_tensors_are_the_formulas(holdings, world):
    h = holdings[world]
    psi = h[1][0]["psi"]
    n_tensors = len(zero.param_shapes(CONFIG if world == 2 else DEEPER))
    for stage in (1, 2):
        want = zero.flat_zero_bytes(psi, stage, world, n_tensors=n_tensors)
        assert [r["bytes"] for r in h[stage]] == [
            {k: w[k] for k in ("params", "grads", "optimizer")} for w in want]


@pytest.mark.parametrize("world,units", [(2, 3), (4, 4)])
def test_fsdp_gathers_each_unit_twice_and_never_holds_more_than_two(holdings, world, units):
    rank0 = holdings[world][3][0]
    fig = plot_fsdp_gather_free(rank0)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == units and labels[0] == "root"   # drawn bottom up
    for unit in range(units):
        assert len(patches(fig, f"gathered-{unit}-forward")) == 1
        assert len(patches(fig, f"gathered-{unit}-backward")) == 1
    own = {}
    for kind, unit, total in rank0["events"]:
        if kind == "all-gather":
            own[unit] = total - sum(v for u, v in own.items() if u != unit)
    largest_two = sum(sorted(own.values())[-2:])
    assert max(total for *_, total in rank0["events"]) <= largest_two
    assert rank0["events"][-1][2] == 0                     # nothing gathered after the step
    assert not too_small(fig)
    plt.close(fig)


def test_bad_requests_fail_before_any_rank_starts():
    with pytest.raises(ValueError, match="stages must be among"):
        zero_holdings(2, CONFIG, stages=(4,))
    with pytest.raises(TypeError, match="the class itself"):
        zero_holdings(2, CONFIG, fsdp_class=object())
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_zero_holdings({})
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_fsdp_gather_free({"events": [], "units": []})
