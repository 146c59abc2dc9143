"""Chapter 00's whole game: two DDP ranks draw the one-process loss curve (and do not when both
read the same data); the sample after training reads like the corpus, the one before does not;
the strategy map names a chapter for every strategy."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from course_lib import run  # noqa: E402
from course_lib.capstone.sample import (as_text, generate, model_from, printable_share,  # noqa: E402
                                        word_overlap)
from course_lib.capstone.show import STRATEGIES, plot_strategy_map, plot_whole_game  # noqa: E402
from course_lib.capstone.whole_game import LIVE, train_gpt_ddp  # noqa: E402
from course_lib.common.models import get_config  # noqa: E402
from figure_checks import texts, too_small  # noqa: E402

#: the 2-rank curve stays within this of the 1-process curve over chapter 00's 200 steps
#: (seen: under 1e-6, summation order); ranks reading the same rows are ~1e-2 off within 20 steps
CURVE_TOLERANCE = 1e-4
#: how much the sample after training must beat the one before (the notebooks' seeds and
#: lengths): printable-ASCII share (seen: 0.39-0.40 -> 1.00) and the share of its words (runs of
#: 3+ letters) found in the corpus (seen: 0.00 -> 0.19 in chapters 00 and 12, 0.61 after the
#: stored 1,500 steps)
PRINTABLE_MARGIN, WORDS_MARGIN = 0.4, 0.1
SAMPLE = {"n_bytes": 200}


def _gap(a: dict, b: dict) -> float:
    return max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))


def _both_ranks_read_rank_0s_rows(**kwargs):
    """The broken variant: every rank reads rank 0's share of each global batch."""
    import course_lib.capstone.whole_game as whole_game
    real = whole_game.get_batch
    whole_game.get_batch = lambda *a, rank=0, **k: real(*a, rank=0, **k)
    return whole_game.train_gpt_ddp(**kwargs)


@pytest.fixture(scope="module")
def one():
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank
    try:
        return train_gpt_ddp(**LIVE)
    finally:
        torch.set_num_threads(threads)


def test_two_ddp_ranks_draw_the_one_process_curve(one):
    two = run(train_gpt_ddp, 2, threads=1, **LIVE)
    assert len(one["losses"]) == LIVE["steps"]
    assert one["losses"][-1] < one["losses"][0] - 2  # it learns: 5.6 -> ~2.4 nats per byte
    assert two[0]["losses"] == two[1]["losses"]  # every rank reports the global batch's loss
    assert _gap(one, two[0]) < CURVE_TOLERANCE


def test_the_curves_part_when_both_ranks_read_the_same_data(one):
    steps = {**LIVE, "steps": 20}
    broken = run(_both_ranks_read_rank_0s_rows, 2, threads=1, **steps)[0]
    assert _gap({"losses": one["losses"][:20]}, broken) > 10 * CURVE_TOLERANCE


def test_the_sample_after_training_reads_like_the_corpus(one):
    config = get_config(LIVE["preset"])
    before = generate(model_from(config), **SAMPLE)
    after = generate(model_from(config, one["params"]), **SAMPLE)
    assert printable_share(after) >= printable_share(before) + PRINTABLE_MARGIN, (before, after)
    assert word_overlap(after) >= word_overlap(before) + WORDS_MARGIN, (before, after)
    assert "\n" in after and "·" not in as_text(after)


def test_the_style_measures_on_known_text():
    assert printable_share("ab\n\x00") == 0.75 and printable_share("") == 0.0
    assert word_overlap("the king, zqxw!") == pytest.approx(2 / 3)
    assert word_overlap("a 1 !") == 0.0
    assert as_text("a\n\x1b[31m\ufffdb") == "a\n·[31m·b"


def test_the_whole_game_figure_and_the_strategy_map_are_legible(one):
    fig = plot_whole_game(one, one)
    assert not too_small(fig)
    assert "largest gap 0e+00" in fig.axes[0].get_title()
    chart = plot_strategy_map()
    assert not too_small(chart)
    shown = " ".join(t.get_text() for t in texts(chart))
    for s in STRATEGIES:
        assert s["name"] in shown and f"chapter {s['chapter']}" in shown
    names = " ".join(s["name"] for s in STRATEGIES)
    for strategy in ("Data parallel", "FSDP", "Tensor", "Pipeline", "Context", "Expert"):
        assert strategy in names
