"""The planner against reality: each rank's peak planned on fake tensors within 5 % of the peak
measured on real CPU ranks, for every layout chapter 12 trains (``LAYOUTS``) and the data × tensor
layouts of the reference script (dp 2 × tp 2, dp 4); and the check catches a planner that forgets
the optimizer's moments, the tensor-parallel split or DDP's buckets."""
from __future__ import annotations

import pytest
import torch

from course_lib.capstone.measure import LAYOUTS, train_gpt
from course_lib.plan import course
from course_lib.plan.course import cpu_layout, plan_course
from course_lib.plan.layouts import Candidate

CHECKED = [dict(layout) for layout in LAYOUTS] + [{"dp": 2, "tp": 2}, {"dp": 4}]
BATCH = 8


@pytest.fixture(scope="module")
def measured() -> dict:
    """Each layout's per-rank peak of the second step, on real ranks (chapter 12's run)."""
    out = {}
    for layout in CHECKED:
        report = train_gpt(layout, preset="small", steps=2, batch_size=BATCH, eval_every=0)
        out[str(layout)] = [r.peak_measured for r in report.ranks]
    return out


def _off(layout: dict, measured: dict) -> float:
    planned = plan_course(layout, "small", BATCH).peaks
    real = measured[str(layout)]
    assert len(planned) == len(real) and all(real)
    return max(abs(p / m - 1) for p, m in zip(planned, real))


@pytest.mark.parametrize("layout", CHECKED, ids=[str(x) for x in CHECKED])
def test_planned_peak_within_5_percent_of_real_ranks(layout, measured):
    assert _off(layout, measured) <= 0.05


def _sgd(params, name="adam", **kw):
    return torch.optim.SGD(params, lr=1e-3)


def _unsplit(block, config, mesh):
    return block


class _NoBuckets(torch.nn.Module):
    def __init__(self, module, group):
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


@pytest.mark.parametrize("what, patch, layout", [
    ("the optimizer's moments", ("make_optimizer", _sgd), {"dp_shard": 2}),
    ("the TP shard", ("dtensor_block", _unsplit), {"tp": 2}),
    ("DDP's bucket copy", ("_DDPStandIn", _NoBuckets), {"dp": 2}),
])
def test_the_check_fails_on_a_planner_that_forgets(what, patch, layout, measured, monkeypatch):
    monkeypatch.setattr(course, *patch)
    assert _off(layout, measured) > 0.05, f"a planner forgetting {what} passed"


def test_a_bad_course_layout_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="'dp' is torch DDP"):
        plan_course({"dp": 2, "dp_shard": 2})
    with pytest.raises(ValueError, match="tp=3"):
        plan_course({"tp": 3})
    with pytest.raises(ValueError, match="batch_size"):
        plan_course({"dp": 4}, batch_size=6)


@pytest.mark.parametrize("candidate, expected", [
    (Candidate(dp_shard=8, tp=8), {"dp_shard": 2, "tp": 2}),
    (Candidate(dp_replicate=8, dp_shard=8), {"dp_replicate": 2, "dp_shard": 2}),
    (Candidate(dp_replicate=64), {"dp": 2}),
    (Candidate(dp_shard=4, tp=8, pp=2), {"dp_shard": 2, "tp": 2}),
    (Candidate(dp_shard=32, pp=2), {"pp": 2, "dp_shard": 2}),
    (Candidate(tp=8), {"tp": 2}),
])
def test_a_cluster_layout_keeps_its_shape_on_cpu_ranks(candidate, expected):
    assert cpu_layout(candidate) == expected
