"""torch's interleaved 1F1B and ZB-V schedules: same gradients as the unsplit model, a measured
bubble, the stage placement of each schedule, and bad requests refused before any process."""
from __future__ import annotations

import pytest
import torch

from course_lib.common.models import GPTConfig
from course_lib.pipeline_parallel.measure import dense_reference
from course_lib.pipeline_parallel.torch_schedules import (measure_torch_schedule,
                                                          measure_torch_schedules, stages_of_rank,
                                                          torch_bubble_formula)

SMALL = GPTConfig(n_layer=4, n_head=2, d_model=32, seq_len=16)


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "zb-v"])
def test_torch_schedule_equals_unsplit_model_and_measures_a_bubble(schedule):
    report = measure_torch_schedule(schedule, p=2, m=4, config=SMALL, micro_batch=2, steps=2)
    loss, grads = dense_reference(SMALL, 8)
    assert report["loss"] == pytest.approx(loss, abs=1e-5)
    assert report["grads"].keys() == grads.keys()
    torch.testing.assert_close(report["grads"], grads, rtol=1e-5, atol=1e-6)
    assert len(report["bubbles"]) == 2 and all(0 < b < 1 for b in report["bubbles"])
    assert report["bubble"] in report["bubbles"]


def test_several_schedules_in_one_launch_equal_the_unsplit_model():
    reports = measure_torch_schedules(("1f1b", "zb-v"), p=2, m=2, config=SMALL, micro_batch=2,
                                      steps=1)
    loss, grads = dense_reference(SMALL, 4)
    assert list(reports) == ["1f1b", "zb-v"]
    for name, report in reports.items():
        assert report["schedule"] == name and len(report["bubbles"]) == 1
        assert report["loss"] == pytest.approx(loss, abs=1e-5)
        torch.testing.assert_close(report["grads"], grads, rtol=1e-5, atol=1e-6)


def test_stage_placement_and_formulas():
    assert [stages_of_rank("interleaved-1f1b", r, 4) for r in range(4)] == \
        [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [stages_of_rank("zb-v", r, 4) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert torch_bubble_formula("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert torch_bubble_formula("interleaved-1f1b", 4, 8) == pytest.approx(3 / 19)
    assert torch_bubble_formula("zb-v", 4, 8) == 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"schedule": "zero"}, "unknown schedule 'zero'"),
    ({"schedule": "zb-v", "p": 3}, "needs 6 stages"),
    ({"schedule": "1f1b", "p": 1}, "p must be >= 2"),
    ({"schedule": "interleaved-1f1b", "m": 1}, "at least p=2"),
    ({"schedule": "1f1b", "m": 0}, "m must be a positive integer"),
])
def test_bad_requests_fail_before_any_process(kwargs, message, monkeypatch):
    import course_lib.pipeline_parallel.torch_schedules as module
    monkeypatch.setattr(module, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=message):
        measure_torch_schedule(**kwargs)


def _rows(**bubbles):
    from course_lib.pipeline_parallel.torch_schedules import torch_bubble_formula
    return {name.replace("_", "-"): {"schedule": name.replace("_", "-"), "p": 2, "bubble": b,
                                     "load": 0.2, "formula": torch_bubble_formula(name.replace("_", "-"), 2, 4)}
            for name, b in bubbles.items()}


def test_order_verdict_is_computed_from_the_measured_bubbles():
    from course_lib.pipeline_parallel.torch_schedules import order_verdict
    ok = order_verdict(_rows(zb_v=0.10, interleaved_1f1b=0.14, **{"1f1b": 0.23}), cores=2)
    assert ok == ("bubble measured 1f1b 0.23, interleaved-1f1b 0.14, zb-v 0.10; formulas 0.20, "
                  "0.11, 0.00: falling in the formulas' order")
    assert order_verdict(_rows(zb_v=0.18, interleaved_1f1b=0.14, **{"1f1b": 0.23}),
                         cores=2).endswith("NOT falling in the formulas' order")
    busy = _rows(zb_v=0.10, interleaved_1f1b=0.14, **{"1f1b": 0.23})
    busy["zb-v"]["load"] = 3.0     # a record made before the core share was measured
    assert "no verdict — load 3.0 on 2 cores" in order_verdict(busy, cores=2)
    shared = _rows(zb_v=0.10, interleaved_1f1b=0.14, **{"1f1b": 0.23})
    for row in shared.values():
        row.update(load=3.0, core_share=0.95)   # the notebook's own earlier cells raised the load
    assert order_verdict(shared, cores=2).endswith("falling in the formulas' order")
    shared["1f1b"]["core_share"] = 0.6
    assert "no verdict — the ranks had a core for only 60% of their compute time" in \
        order_verdict(shared, cores=2)
    assert "no verdict — 2 ranks on 1 usable cores" in order_verdict(shared, cores=1)
