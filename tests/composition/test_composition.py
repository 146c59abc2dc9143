"""Chapter 09: every layout of run_parallel trains like one process and holds the bytes the
independent formula predicts; bad layouts fail before any process starts; DeviceMesh groups."""
from __future__ import annotations

import pytest

from course_lib import run_parallel
from course_lib.common.models import get_config
from course_lib.composition.layout import Layout
from course_lib.composition.layouts import predict_gpt_bytes, predict_pp_bytes
from course_lib.composition.mesh import show_meshes
from course_lib.composition.scale import LLAMA3_405B, at_scale
from course_lib.sharding.formulas import param_shapes, per_rank_bytes


@pytest.mark.parametrize("layout", [{"dp_shard": 2, "tp": 2}, {"dp_replicate": 2, "dp_shard": 2},
                                    {"ep": 2}, {"pp": 2, "dp_shard": 2},
                                    {"pp": 2, "dp_shard": 2, "tp": 2}, {"dp": 2, "tp": 2},
                                    {"pp": 2, "tp": 2, "dp": 2}], ids=str)
def test_layout_equals_single_process_and_bytes_equal_prediction(layout):
    report = run_parallel(layout, steps=2)
    assert report.world == 2 ** len(layout)
    assert report.max_abs_diff_vs_single < report.tolerance
    assert report.max_abs_grad_diff_vs_single < report.grad_tolerance
    for got, want in zip(*report.losses.values()):
        assert got == pytest.approx(want, abs=1e-5)
    for rank in report.ranks:
        assert rank.bytes_measured == rank.bytes_predicted
    if "pp" in layout:  # the two stages hold different parts of the model
        stages = {r.bytes_predicted["model_states"] for r in report.ranks}
        assert len(stages) == 2
    if "tp" in layout and "pp" in layout:  # Megatron's split: a stage's blocks shrink with tp
        flat = predict_pp_bytes(get_config("tiny"), Layout(**{**layout, "tp": 1}), 1)["params"]
        assert report.ranks[-1].bytes_measured["params"] < flat
    if "ep" in layout:  # every routed token reached its expert's owner exactly once
        assert list(report.tokens_per_expert.values()) == report.tokens_per_expert_single
        assert all(b > 0 for b in report.all_to_all_bytes)


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_equals_sdpa_and_activation_bytes_fall_with_cp(cp):
    report = run_parallel({"cp": cp})
    assert report.max_abs_diff_vs_single < report.tolerance
    assert report.max_abs_grad_diff_vs_single < report.grad_tolerance  # the ring backward
    for rank in report.ranks:
        assert rank.bytes_measured == rank.bytes_predicted
    full, mine = report.single_bytes, report.ranks[0].bytes_measured
    assert mine["score_bytes"] * cp * cp == full["score_bytes"]
    assert mine["activation_bytes"] < full["activation_bytes"] * 1.5 / cp + 1


def test_two_d_prediction_is_chapter_3_formula_divided_by_tp():
    config = get_config("tiny")
    fsdp2 = per_rank_bytes(param_shapes(config), "fsdp", 2)[0]["params"]
    both = predict_gpt_bytes(config, Layout(dp_shard=2, tp=2))["params"]
    assert both < fsdp2 and predict_gpt_bytes(config, Layout(dp_shard=2))["params"] == fsdp2
    assert at_scale(config, {"dp_shard": 2, "tp": 2}, vocab_parallel=False).per_gpu_bytes == \
        predict_gpt_bytes(config, Layout(dp_shard=2, tp=2))["model_states"]


def test_the_stages_shapes_are_the_models_shapes_split():
    from course_lib.composition.layouts import stage_shapes, tp_shapes
    config = get_config("tiny")
    whole = sorted(param_shapes(config))
    assert sorted(stage_shapes(config, 1, 1, 0)) == whole
    assert sorted(stage_shapes(config, 1, 2, 0) + stage_shapes(config, 1, 2, 1)) == whole
    assert sorted(stage_shapes(config, 2, 1, 0)) == sorted(tp_shapes(config, 2))


def test_llama3_405b_layout_is_about_16_bytes_per_param_over_all_gpus():
    r = at_scale("405B", LLAMA3_405B)
    assert r.gpus == 16384 and 400e9 < r.params < 420e9
    even = 16 * r.params / r.gpus
    assert even < r.per_gpu_bytes < 1.2 * even  # a stage holds 8 of 126 layers, not 126/16
    no_fsdp = at_scale("405B", {"tp": 8, "pp": 16}).per_gpu_bytes
    assert no_fsdp == pytest.approx(128 * r.per_gpu_bytes, rel=1e-3)
    with pytest.warns(DeprecationWarning, match=r"AtScale\['gpus'\] is deprecated; read the "
                                                r"attribute \.gpus"):
        assert r["gpus"] == r.gpus  # the old key, one release
    with pytest.raises(ValueError, match="mesh dimension 'dp' is not one this run takes"):
        at_scale("7B", {"dp": 8})


@pytest.mark.parametrize("layout, message", [
    ({"dq": 2}, "unknown mesh dimension 'dq'"),
    ({"dp": 2, "dp_shard": 2}, "'dp' is torch DDP"),
    ({"dp_replicate": 2, "tp": 2}, "'dp_replicate' is HSDP's replicated dimension"),
    ({"dp_shard": 4, "tp": 4}, "needs 16 ranks"),
    ({"pp": 2, "tp": 2}, "not among the combinations checked here"),
    ({"tp": 2, "cp": 2}, "'cp' runs on its own"),
    ({"ep": 2, "dp_shard": 2}, "'ep' runs on its own"),
    ({"dp_shard": 1, "tp": 4}, "tp=4 must divide the 2 attention heads"),
    ({"ep": 3}, "ep=3 must divide the 4 experts"),
    ({"cp": 3}, "cp=3 must divide the sequence length 64"),
    ({"pp": 4, "dp_shard": 1}, "has 2 stages"),
    ({"dp_shard": 0}, "must be a positive integer"),
    ([("tp", 2)], "must be a dict of mesh dimension"),
    ({}, "needs 1 ranks"),
])
def test_bad_layouts_fail_before_any_process(layout, message, monkeypatch):
    import course_lib.composition.measure as measure
    monkeypatch.setattr(measure, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=message):
        run_parallel(layout)


def test_mesh_groups_follow_named_dimensions():
    result = show_meshes(4)
    for r in result["2-D"]:
        dims = r["dims"]
        assert dims["tp"]["group_ranks"] == [r["rank"] // 2 * 2, r["rank"] // 2 * 2 + 1]
        assert dims["dp"]["group_ranks"] == [r["rank"] % 2, r["rank"] % 2 + 2]
        assert dims["tp"]["all_reduce_of_ranks"] == sum(dims["tp"]["group_ranks"])
    assert all(r["dims"]["dp"]["group_ranks"] == [0, 1, 2, 3] for r in result["1-D"])


def test_bubble_lines_say_which_way_and_by_how_much():
    """Chapter 09's schedule cell: a measured bubble is set beside its formula with the signed gap."""
    from course_lib.composition.show import bubble_lines
    lines = bubble_lines([{"schedule": "1f1b", "bubble": 0.24, "formula": 0.20},
                          {"schedule": "zb-v", "bubble": 0.0, "formula": 0.0},
                          {"schedule": "interleaved-1f1b", "bubble": 0.05, "formula": 0.11}])
    assert lines[0].endswith("0.04 above the formula")
    assert lines[1].endswith("on the formula")
    assert lines[2].endswith("0.06 below the formula")
    assert not any("as predicted" in line for line in lines)
