"""Chapter 4's split-weight picture, drawn from two real TP runs (t = 2 and t = 4)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.tensor_parallel.layers import tp_plan  # noqa: E402
from course_lib.tensor_parallel.measure import TP_CONFIG, measure_tp  # noqa: E402
from course_lib.tensor_parallel.show import plot_tp_split  # noqa: E402
from figure_checks import patches, too_small  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    return {t: measure_tp(t) for t in (2, 4)}


@pytest.mark.parametrize("t", [2, 4])
def test_each_rank_keeps_rows_of_column_and_columns_of_row_parallel_weights(runs, t):
    fig = plot_tp_split(runs[t])
    h = TP_CONFIG.d_model
    for name, style in tp_plan().items():
        for rank in range(t):
            parts = patches(fig, f"slice-{name}-{rank}")
            area = sum(p.get_width() * p.get_height() for p in parts)
            shard = runs[t][rank].grads[f"{name}.weight"][0]
            assert area == shard.numel()                 # the rank's own shard, drawn to scale
            sizes = {p.get_width() if style == "row" else p.get_height() for p in parts}
            assert sum(sizes) * (3 if name == "attn.qkv" else 1) == \
                (3 * h if name == "attn.qkv" else 4 * h if name.startswith("mlp") else h) // t
        assert len(patches(fig, f"slice-{name}-")) == t * (3 if name == "attn.qkv" else 1)
    assert len(patches(fig, "f-")) == len(patches(fig, "g-")) == 2   # before columns, after rows
    assert not too_small(fig)
    plt.close(fig)


def test_a_shard_that_is_not_the_split_is_refused(runs):
    wrong = runs[4][:2]                                  # two ranks' shards of a 4-way split
    with pytest.raises(ValueError, match="not the Megatron split"):
        plot_tp_split(wrong)
