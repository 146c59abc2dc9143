"""The key "zero2" meant torch's fully_shard(reshard_after_forward=False), not the paper's ZeRO-2:
it is now "fsdp_no_reshard"; the old key works one release, with a DeprecationWarning."""
import warnings

import pytest

from course_lib.common.models import get_config
from course_lib.sharding import formulas
from course_lib.sharding.strategies import FSDP_ONLY, STRATEGIES, validate_strategy


def test_the_new_key_replaces_the_old_one_everywhere_it_is_listed():
    assert "fsdp_no_reshard" in STRATEGIES and "zero2" not in STRATEGIES
    assert FSDP_ONLY == ("fsdp_no_reshard", "fsdp")
    assert formulas.STAGES["fsdp_no_reshard"] == 2 and "zero2" not in formulas.STAGES
    assert [row["course"] for row in formulas.NAMES_IN_THE_WILD] == list(STRATEGIES)


def test_the_old_key_warns_and_gives_the_new_keys_numbers():
    shapes = formulas.param_shapes(get_config("tiny"))
    with pytest.warns(DeprecationWarning, match="'zero2' is deprecated: use 'fsdp_no_reshard'"):
        old = formulas.per_rank_bytes(shapes, "zero2", 4, precision="amp")
    assert old == formulas.per_rank_bytes(shapes, "fsdp_no_reshard", 4, precision="amp")
    with pytest.warns(DeprecationWarning):
        assert formulas.comm_bytes(shapes, "zero2", 4) == formulas.comm_bytes(shapes, "fsdp_no_reshard", 4)
    with pytest.warns(DeprecationWarning):
        assert formulas.canonical_strategy("zero2") == "fsdp_no_reshard"


def test_new_keys_and_the_papers_meaning_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for strategy in STRATEGIES:
            assert formulas.canonical_strategy(strategy) == strategy
            validate_strategy(strategy)
        validate_strategy("zero2")                         # accepted; the warning comes where it is used
        assert "zero2" in formulas.paper_bytes(1e9, 8)     # the paper's ZeRO-2 keeps its name
    with pytest.raises(ValueError, match="unknown strategy"):
        validate_strategy("zero4")


def test_compare_strategies_reports_under_the_new_key(monkeypatch):
    import course_lib.sharding.measure as measure
    monkeypatch.setattr(measure, "run", lambda fn, n, cfg, batch, strategies, **kw: [
        {s: f"report {s}" for s in strategies}] * n)
    with pytest.warns(DeprecationWarning):
        out = measure.compare_strategies("tiny", (2, 16), strategies=["zero2"], nprocs=2)
    assert out == {"fsdp_no_reshard": ["report fsdp_no_reshard"] * 2}


def test_the_planner_takes_the_old_key_as_the_new_one():
    from course_lib.finetuning.planner import _LABELS, FULL_STRATEGIES
    assert "fsdp_no_reshard" in FULL_STRATEGIES and "zero2" not in FULL_STRATEGIES
    assert "ZeRO-2" not in _LABELS["fsdp_no_reshard"]
