"""The bubble experiment (chapter 4): p = 2 ranks pinned one per core, m = 1, 2, 4, 8, GPipe and
1F1B in one launch; the measured bubble falls with m and is graded against (p-1)/(m+p-1) within
TOLERANCE of the formula's value (relative).

The first test needs each rank to have a core of its own: where the machine cannot give that
(fewer than 2 usable cores, or ranks starved by other work), it is skipped with the verdict's
own reason, which is what the notebook prints there too. The others hold on any machine.
"""
from __future__ import annotations

import pytest

import course_lib.pipeline_parallel.bubble as bubble
from course_lib.launcher import devices
from course_lib.pipeline_parallel.bubble import (MIN_CORE_SHARE, TOLERANCE, BubbleRow, BubbleSweep,
                                                 bubble_for_actions, measure_bubble_sweep)
from course_lib.pipeline_parallel.measure import bubble_for_stages, bubble_formula
from course_lib.pipeline_parallel.schedules import schedule_ops
from course_lib.pipeline_parallel.trace import StageTrace

#: How far below the model for the stages' mean costs a measurement may lie: it leaves out how
#: much each micro-batch's action varies, which only adds idle time (docs/decisions/
#: pipeline-bubble.md, "Why the bubble is compared with a model of unequal stages").
STAGE_TOLERANCE = 0.08
#: |measured - the layout of the same step's actions with instant messages|: what is left is the
#: messages and the Python between actions; 14 idle sweeps measured +0.003 to +0.052
#: (docs/decisions/pipeline-bubble.md, "What the bubble test asserts, and why it measures twice").
ACTION_TOLERANCE = 0.08


def _one_at_a_time(schedule, p, m, rank):
    """A broken schedule: each micro-batch's forward and backward before the next one starts."""
    return [op for i in range(m) for op in (("F", i), ("B", i))]


def _misses(sweep: BubbleSweep) -> list[str]:
    """What the sweep got wrong of what the chapter teaches; empty when it showed all of it."""
    out = []
    for name in ("gpipe", "1f1b"):
        rows = sweep.schedule(name)
        # m = 1, 2 land on the formula; at m = 4, 8 idle runs measured +0.02 to +0.11 above it
        # (docs/decisions/pipeline-bubble.md, "Why the bubble test does not ask for the band at
        # every m"), so those are held to "never below the formula, at most half of
        # m = 1's bubble", and the verdict line reports which way and by how much they missed.
        checks = {
            "falls with m": all(a.bubble > b.bubble for a, b in zip(rows, rows[1:])),
            "m = 1, 2 on the formula": all(abs(r.bubble - bubble_formula(2, r.m))
                                               <= TOLERANCE * bubble_formula(2, r.m) for r in rows[:2]),
            "never 0.05 below the formula": all(r.bubble >= bubble_formula(2, r.m) - 0.05
                                                for r in rows),
            "m = 8 at most half of m = 1": rows[-1].bubble <= rows[0].bubble / 2,
            # what is left of the excess: the stages' mean costs explain part of it (the rest
            # only adds idle time), the step's own actions laid out all but the messages
            "not below the stage model": all(r.bubble >= r.for_stages - STAGE_TOLERANCE for r in rows),
            "on the layout of its actions": all(abs(r.bubble - r.for_actions) <= ACTION_TOLERANCE
                                                for r in rows),
        }
        out += [f"{name}: {check}" for check, held in checks.items() if not held]
    return out


@pytest.fixture(scope="module")
def sweep():
    if devices.cpu_count() < 2:
        pytest.skip("needs 2 usable cores: one per pinned rank")
    sweep = measure_bubble_sweep(p=2)
    if not sweep.spoiled() and _misses(sweep):
        # One more launch before judging: on this VM one step's actions vary enough that a
        # median of 5 at m = 4 read below the formula, under m = 8's, in 2 of 13 idle sweeps,
        # and the layout of those very actions said the same (docs/decisions/pipeline-bubble.md,
        # "What the bubble test asserts, and why it measures twice").
        sweep = measure_bubble_sweep(p=2)
    return sweep


def test_bubble_falls_with_m_and_starts_on_the_formula(sweep):
    assert [(r.schedule, r.m) for r in sweep.rows] == [(s, m) for s in ("gpipe", "1f1b")
                                                       for m in (1, 2, 4, 8)]
    why = sweep.spoiled()   # among the reasons: a send + recv not small against the compute
    if why:
        pytest.skip(f"this machine cannot show the bubble now: {why}")
    assert sweep.compute_ratio >= bubble.MIN_COMPUTE_RATIO
    assert _misses(sweep) == [], sweep.table()
    for name in ("gpipe", "1f1b"):
        assert "for the stages as they ran" in sweep.verdict(name)
        assert "for every action as it ran" in sweep.verdict(name)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 8), (4, 4), (4, 16)])
def test_equal_stages_give_the_formula(schedule, p, m):
    predicted = bubble_for_stages(schedule, m, [0.01] * p, [0.02] * p)
    assert predicted == pytest.approx(bubble_formula(p, m))


def test_the_slowest_stage_sets_the_pace():
    """Stage 0 forwards in 1 and backwards in 4, stage 1 in 2 and 2 (ms), m = 3: GPipe's phases
    take 1 + 2 + 2·2 = 7 and 4 + 2 + 2·4 = 14, so 21 ms for 3 · 9 ms of work on each of 2 ranks.
    1F1B, laid out by hand: rank 0 F0 0-1, F1 1-2; rank 1 F0 1-3, B0 3-5; rank 0 B0 5-9, F2
    9-10, B1 10-14 (rank 1's B1 ended at 9), B2 14-18: 18 ms, and stage 0's F + B = 5 per
    micro-batch paces it from its first backward on."""
    assert bubble_for_stages("gpipe", 3, [1, 2], [4, 2]) == pytest.approx(1 - 27 / 42)
    assert bubble_for_stages("1f1b", 3, [1, 2], [4, 2]) == pytest.approx(1 - 27 / 36)
    assert bubble_for_stages("gpipe", 3, [1, 2], [4, 2]) > bubble_formula(2, 3)


def _traces(schedule: str, m: int, cost) -> list:
    """Synthetic traces of a step in ``schedule``'s order: ``cost(rank, kind, i)`` seconds each,
    laid end to end on each rank (the replay reads only the order and the durations)."""
    traces = []
    for rank in range(2):
        t, trace = 0.0, StageTrace(rank)
        for kind, i in schedule_ops(schedule, 2, m, rank):
            trace.events.append((kind, i, t, t + cost(rank, kind, i)))
            t += cost(rank, kind, i)
        traces.append(trace)
    return traces


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_replaying_equal_actions_gives_the_formula(schedule, m):
    traces = _traces(schedule, m, lambda r, kind, i: 0.01 if kind == "F" else 0.02)
    assert bubble_for_actions(traces) == pytest.approx(bubble_formula(2, m))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_replaying_unequal_stages_gives_the_stage_model(schedule):
    """Each rank's actions all cost the same, the ranks differ: the stage model's own case."""
    f, b = [0.001, 0.002], [0.004, 0.002]
    traces = _traces(schedule, 3, lambda r, kind, i: f[r] if kind == "F" else b[r])
    assert bubble_for_actions(traces) == pytest.approx(bubble_for_stages(schedule, 3, f, b))


def test_replaying_varying_actions_waits_longer_than_their_means():
    """Micro-batches alternate slow and fast, on the two ranks out of step: each rank waits for
    the later of two actions, so the bubble is above the model for the same mean costs."""
    slow = lambda r, kind, i: (0.015 if (i + r) % 2 else 0.005) * (1 if kind == "F" else 2)
    replayed = bubble_for_actions(_traces("gpipe", 8, slow))
    assert replayed > bubble_for_stages("gpipe", 8, [0.01] * 2, [0.02] * 2) + 0.01


def test_a_replay_of_orders_that_wait_on_each_other_says_so():
    traces = [StageTrace(0, events=[("B", 0, 0.0, 0.02), ("F", 0, 0.02, 0.03)]),   # B 0 first
              StageTrace(1, events=[("F", 0, 0.0, 0.01), ("B", 0, 0.01, 0.03)])]   # waits for F 0
    with pytest.raises(ValueError, match="deadlocks: rank 0 waits before \\('B', 0\\)"):
        bubble_for_actions(traces)


def test_a_schedule_that_does_not_pipeline_is_not_as_predicted():
    """The verdict can fail: one micro-batch at a time keeps half of every step idle at any m."""
    if devices.cpu_count() < 2:
        pytest.skip("needs 2 usable cores")
    broken = measure_bubble_sweep(p=2, ms=(1, 4), schedules=("1f1b",), steps=1, ops=_one_at_a_time)
    rows = broken.schedule("1f1b")
    assert rows[1].bubble > bubble_formula(2, 4) * (1 + TOLERANCE), broken.table()
    # the stage model assumes a pipelined order too: it cannot explain this one away
    assert rows[1].bubble > rows[1].for_stages + STAGE_TOLERANCE, broken.table()
    assert "NOT as predicted" in broken.verdict("1f1b") or "no verdict" in broken.verdict("1f1b")


def _sweep(**kwargs):
    stage = kwargs.pop("stage_s", [])
    share = kwargs.get("share", 1.0)
    rows = [BubbleRow("gpipe", m, bubble_formula(2, m) + kwargs.pop(f"off{m}", 0.0),
                      bubble_formula(2, m), [], share, 0.02, [0.020, 0.022], stage)
            for m in (1, 2, 4, 8)]
    kwargs.pop("share", None)
    return BubbleSweep(**{"p": 2, "cores": 2, "pinned": True, "overhead_s": 2e-4, "load": 0.3,
                          "rows": rows, **kwargs})


def test_verdict_says_as_predicted_or_by_how_much_not():
    assert _sweep().verdict("gpipe") == ("gpipe: bubble 0.50 → 0.11 as m went 1 → 8; formula "
                                         "0.50 → 0.11: as predicted (within ±20% of the formula)")
    off = _sweep(off8=0.13).verdict("gpipe")
    assert "NOT as predicted (above the formula at m=8 by +0.130, +117%" in off
    assert off.endswith("stages differ by 10% in CPU time per micro-batch)")
    below = _sweep(off4=-0.06).verdict("gpipe")
    assert "NOT as predicted (below the formula at m=4 by -0.060, -30%" in below
    rising = _sweep(off8=0.1).verdict("gpipe")   # 0.200 → 0.211: the bubble grew with m
    assert "NOT as predicted" in rising and "; not falling with m;" in rising
    uneven = _sweep(off8=0.02, stage_s=[[0.005, 0.012], [0.006, 0.010]]).verdict("gpipe")
    assert uneven.endswith("as predicted (within ±20% of the formula); for the stages as they ran "
                           "(F + B per micro-batch 17.0 / 16.0 ms at m=8) the model gives 0.50 → 0.17, "
                           "measured at most -0.04 from it"), uneven


def test_the_band_is_relative_a_bubble_near_twice_the_formula_is_not_as_predicted():
    """At m = 8 the formula says 0.111; a measured 0.21 is nearly twice that. The old absolute
    band (±0.10 at every m) read this falling 0.50 → 0.33 → 0.29 → 0.21 "as predicted"; the band
    is now a share of the formula."""
    line = _sweep(off4=0.09, off8=0.099).verdict("gpipe")
    assert "NOT as predicted (above the formula at m=8 by +0.099, +89%" in line, line
    assert "as predicted (within" not in line
    # m = 1's formula is 0.5: the same band is ±0.10 there
    assert "as predicted (within" in _sweep(off1=0.09).verdict("gpipe")
    assert "NOT as predicted (above the formula at m=1" in _sweep(off1=0.11).verdict("gpipe")


def test_the_schedule_gap_line_gives_each_m_and_the_layout_beside_it():
    from course_lib.pipeline_parallel.bubble import schedule_gap
    rows = [BubbleRow(s, m, bubble_formula(2, m) + (0.03 if s == "1f1b" else 0.01), bubble_formula(2, m),
                      [], 1.0, 0.02, for_actions=bubble_formula(2, m) + (0.01 if s == "1f1b" else 0.0))
            for s in ("gpipe", "1f1b") for m in (4, 8)]
    sweep = BubbleSweep(2, 2, True, 2e-4, 0.3, rows)
    assert schedule_gap(sweep) == ("1F1B minus GPipe, measured: m=4 +0.020, m=8 +0.020; laid out "
                                   "from each step's own actions, messages free: +0.010, +0.010")


@pytest.mark.parametrize("kwargs, reason", [
    (dict(cores=1), "2 ranks need 2 usable cores, this process may use 1"),
    (dict(share=MIN_CORE_SHARE - 0.1), "the machine is busy"),
    (dict(overhead_s=0.005), "compute per action is only 4x the per-action overhead"),
])
def test_a_machine_that_cannot_show_it_gets_no_verdict_and_the_reason(kwargs, reason):
    line = _sweep(**kwargs).verdict("gpipe")
    assert "no verdict" in line and reason in line and "as predicted" not in line


@pytest.mark.parametrize("kwargs, message", [
    (dict(p=1), "a bubble needs p >= 2"),
    (dict(ms=(4, 2)), "ms must be increasing"),
    (dict(p=3), "p=3 stages do not divide"),
    (dict(schedules=("zb",)), "schedule must be one of"),
    (dict(p=4), "pin=True gives every rank its own core: 4 ranks need 4 cores, this process may use 2"),
])
def test_bad_requests_fail_before_any_process_starts(monkeypatch, kwargs, message):
    monkeypatch.setattr(bubble, "run", lambda *a, **k: pytest.fail("a process was started"))
    monkeypatch.setattr(bubble.devices, "cpu_count", lambda: 2)
    with pytest.raises(ValueError, match=message):
        measure_bubble_sweep(**kwargs)


def test_one_report_on_shared_cores_gets_no_verdict(monkeypatch):
    from types import SimpleNamespace
    monkeypatch.setattr(bubble.devices, "cpu_count", lambda: 2)
    report = SimpleNamespace(p=4, m=8, schedule="1f1b", bubble=0.338, formula=3 / 11, bubbles=[0.338],
                             cpu_share=0.69)
    assert bubble.report_verdict(report) == (
        "1f1b, p=4: bubble 0.34 at m=8; formula 0.27: no verdict — 4 ranks need 4 usable cores, "
        "this process may use 2: ranks share cores, so the bubble is not the schedule's alone")


def test_the_stored_runs_load_back_and_give_their_verdicts():
    """Chapters 04 and 09 show these on one core: they must parse and say what they measured."""
    import json

    from course_lib.common.recorded import load_record
    from course_lib.pipeline_parallel.bubble import sweep_from_record, sweep_record
    from course_lib.pipeline_parallel.torch_schedules import order_verdict
    value, label = load_record("bubble_sweep", ("p", "cores", "pinned", "overhead_s", "rows"))
    sweep = sweep_from_record(value)
    assert label.startswith("RECORDED, not measured here") and sweep.cores >= 2 and sweep.pinned
    assert [r.m for r in sweep.schedule("gpipe")] == [1, 2, 4, 8]
    assert "no verdict" not in sweep.verdict("1f1b")
    assert sweep_from_record(json.loads(json.dumps(sweep_record(sweep)))) == sweep
    rows, _ = load_record("torch_schedule_order", ("schedule", "p", "bubble", "formula", "cores"))
    verdict = order_verdict({r["schedule"]: r for r in rows}, cores=rows[0]["cores"])
    assert "no verdict" not in verdict and "zb-v" in verdict
