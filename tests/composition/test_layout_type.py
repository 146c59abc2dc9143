"""The one Layout: parsed and checked once, read by attribute; typed results keep their old
string keys one release, with a DeprecationWarning naming the attribute."""
from __future__ import annotations

import pytest

from course_lib.common.models import get_config
from course_lib.composition.layout import MESH_ORDER, Layout
from course_lib.composition.measure import ParallelReport, RankBytes


def test_a_layout_knows_its_ranks_data_parallel_size_and_stages():
    layout = Layout.parse({"tp": 2, "dp": 2, "pp": 2}, get_config("tiny"))
    assert layout.names == ("pp", "dp", "tp") and layout.shape == (2, 2, 2)
    assert layout.world == 8 and layout.dp_size == 2
    assert [layout.stage_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert Layout.parse(layout) == layout and str(layout) == "{'pp': 2, 'dp': 2, 'tp': 2}"
    assert Layout(dp_replicate=2, dp_shard=3).dp_size == 6 and Layout().world == 1
    assert Layout.parse({}, ranks=(1, 8)).label() == "one process"
    assert Layout(dp_shard=2, tp=2).label() == "dp_shard 2 × tp 2"
    assert set(Layout.__dataclass_fields__) == set(MESH_ORDER)


def test_a_pipeline_runs_on_the_cpu_only():
    pipe, flat = Layout(pp=2, dp_shard=2), Layout(dp_shard=2)
    assert pipe.device_for(None) == pipe.device_for("cpu") == "cpu"
    assert flat.device_for(None) is None and flat.device_for("cuda") == "cuda"
    with pytest.raises(ValueError, match="pipeline layouts run on the CPU"):
        pipe.device_for("cuda")


def test_a_layout_is_frozen_and_its_sizes_positive():
    with pytest.raises(ValueError, match="positive integer"):
        Layout(tp=0)
    with pytest.raises(AttributeError):
        Layout().tp = 2  # frozen: a rank cannot change what the others assume


def test_old_string_keys_still_read_with_a_deprecation_warning_naming_the_attribute():
    report = ParallelReport(Layout(dp=2), 2, 0.0, 0.0, 1e-4, 1e-6,
                            [RankBytes(0, {"params": 4}, {"params": 4})])
    with pytest.warns(DeprecationWarning, match=r"ParallelReport\['world'\].*\.world"):
        assert report["world"] == 2
    with pytest.warns(DeprecationWarning, match=r"\.bytes_measured"):
        assert report.ranks[0]["bytes_measured"] == {"params": 4}
    assert "tokens_per_expert" not in report and report.same_as_single
    with pytest.raises(KeyError):
        report["no such key"]
