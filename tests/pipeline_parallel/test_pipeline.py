"""Pipeline parallelism (chapter 4): hand-written GPipe/1F1B and torch.distributed.pipelining
vs the unsplit model; measured bubble vs (p-1)/(m+p-1); activation stash GPipe vs 1F1B."""
from __future__ import annotations

import pytest
import torch

from course_lib.pipeline_parallel.show import pipeline_explorer
from course_lib.pipeline_parallel.schedules import validate_pipeline, schedule_ops
from course_lib.pipeline_parallel.trace import StageTrace
from course_lib.pipeline_parallel.measure import (PP_CONFIG, bubble_formula, dense_reference,
                                                  measure_pipeline, measured_bubble,
                                                  torch_pipeline)

M, MICRO = 4, 2
# fp32, micro-batch gradients accumulated in a different order than the full batch's single
# backward: observed differences ~6e-8 on gradients of size ~1e-2.
TOL = dict(rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def reference():
    return dense_reference(PP_CONFIG, M * MICRO)


def _grads(report):
    return {n: g for t in report.traces for n, g in t.grads.items()}


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 3])
def test_schedule_runs_every_micro_batch_once(p, m):
    for rank in range(p):
        gpipe, ofob = schedule_ops("gpipe", p, m, rank), schedule_ops("1f1b", p, m, rank)
        assert sorted(gpipe) == sorted(ofob) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        in_flight, peak = 0, 0
        for kind, _ in ofob:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(p - rank, m)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4])
def test_hand_pipeline_equals_unsplit_model(schedule, p, reference):
    ref_loss, ref_grads = reference
    report = measure_pipeline(p, M, schedule, PP_CONFIG, micro_batch=MICRO, steps=1, grads=True)
    assert report.loss == pytest.approx(ref_loss, rel=1e-6)
    grads = _grads(report)
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, **TOL, msg=lambda msg: f"{name}: {msg}")
    # the activation stash, measured: GPipe holds all m micro-batches, 1F1B at most p - rank
    for t in report.traces:
        assert t.stash_peak_count == (M if schedule == "gpipe" else min(p - t.rank, M))


@pytest.mark.parametrize("schedule, p", [("gpipe", 2), ("1f1b", 2), ("1f1b", 4)])
def test_torch_pipelining_equals_unsplit_model(schedule, p, reference):
    ref_loss, ref_grads = reference
    loss, grads = torch_pipeline(p, M, schedule, PP_CONFIG, batch=M * MICRO)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, **TOL, msg=lambda msg: f"{name}: {msg}")


def test_1f1b_stashes_fewer_bytes_than_gpipe():
    m, p = 6, 2
    gpipe = measure_pipeline(p, m, "gpipe", PP_CONFIG, micro_batch=MICRO, steps=1)
    ofob = measure_pipeline(p, m, "1f1b", PP_CONFIG, micro_batch=MICRO, steps=1)
    for g, o in zip(gpipe.traces, ofob.traces):
        per_micro = g.stash_peak_bytes / m          # every micro-batch stashes the same bytes
        assert o.stash_peak_bytes == pytest.approx(per_micro * (p - g.rank), rel=0.01)


def test_time_budget_splits_compute_transfer_bubble():
    """Hand-made events (p=2, m=1): compute, transfer (after the sender finished) and bubble."""
    rank0 = StageTrace(0, events=[("F", 0, 0.0, 1.0), ("B", 0, 4.5, 6.5)], waits=[("B", 0, 1.0, 4.5)])
    rank1 = StageTrace(1, events=[("F", 0, 1.2, 2.2), ("B", 0, 2.2, 4.2)], waits=[("F", 0, -0.5, 1.2)])
    budget = measured_bubble([rank0, rank1])
    assert budget.span == 6.5 and budget.compute == [3.0, 3.0]
    assert budget.transfer == pytest.approx([0.3, 0.2])   # B0 sent at 4.2, F0 at 1.0
    assert budget.bubble == pytest.approx([3.2, 3.3])
    assert budget.bubble_fraction == pytest.approx(6.5 / 13)
    assert budget.transfer_fraction == pytest.approx(0.5 / 13)


def test_measured_bubble_budget_is_consistent():
    """Default configuration (p=2, m=4, GPipe): one launch records 7 steps; every rank's compute,
    transfer and bubble are positive and add up to the step, and the report's bubble is one of
    the recorded steps'. How close it comes to (p-1)/(m+p-1) depends on whether each rank had a
    core (load), so that comparison is a benchmark: ``benchmarks/bench_pipeline_bubble.py``."""
    report = measure_pipeline()             # defaults: p=2, m=4, GPipe, 7 recorded steps
    assert report.formula == bubble_formula(2, 4) == 0.2
    assert len(report.traces) == 2 and all(len(t.events) == 8 for t in report.traces)
    assert [len(t.waits) for t in report.traces] == [4, 4]   # rank 0: backwards, rank 1: forwards
    assert len(report.bubbles) == 7
    assert any(report.bubble == pytest.approx(b) for b in report.bubbles)  # the median step
    budget = report.budget
    for compute, transfer, bubble in zip(budget.compute, budget.transfer, budget.bubble):
        assert compute > 0 and transfer >= 0 and bubble > 0
        assert compute + transfer + bubble == pytest.approx(budget.span)
    assert 0 < report.bubble < 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(p=3), "p=3 stages do not divide n_layer=4"),
    (dict(m=0), r"m \(micro-batches\) must be a positive integer"),
    (dict(schedule="zb"), "schedule must be one of"),
    (dict(micro_batch=0), "micro_batch must be a positive integer"),
])
def test_bad_pipeline_fails_before_start(kwargs, message):
    with pytest.raises(ValueError, match=message):
        measure_pipeline(**{"config": PP_CONFIG, "timeout": 0.001, **kwargs})


def test_pipeline_explorer_answers_with_a_figure():
    report, fig = pipeline_explorer(p=2, m=2, schedule="1f1b", config=PP_CONFIG)
    assert report.formula == pytest.approx(1 / 3) and fig is not None
    assert [len(t.events) for t in report.traces] == [4, 4]


def test_batch_must_split_into_micro_batches():
    with pytest.raises(ValueError, match="m=3 micro-batches do not divide batch=8"):
        torch_pipeline(2, 3, "gpipe", PP_CONFIG, batch=8, timeout=0.001)
    with pytest.raises(ValueError, match="do not divide n_layer"):
        validate_pipeline(PP_CONFIG, 8, 1)


def test_notebook_exercises():
    from course_lib import check_number
    assert check_number((4 - 1) / (8 + 4 - 1), bubble_formula(4, 8), rtol=0.01)
    assert not check_number(3 / 8, bubble_formula(4, 8), rtol=0.01)
    small = measure_pipeline(4, 8, "1f1b", PP_CONFIG, micro_batch=2, steps=1)
    assert check_number(4, small.traces[0].stash_peak_count)
    assert check_number(1, small.traces[3].stash_peak_count)
    assert not check_number(8, small.traces[0].stash_peak_count)   # GPipe's answer
