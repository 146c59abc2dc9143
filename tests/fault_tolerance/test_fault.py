"""Chapter 6: the checkpoint-interval maths, fault plans, and restarts under real torchrun.

The torchrun test runs two randomized trials of ``benchmarks/fault_harness.py`` (the by-hand run
does 20): one kill/raise/external-SIGKILL fault and one death in the middle of a save, each under
``torchrun --max-restarts=1``; final parameters and losses must equal an uninterrupted run bit for
bit and no process may be left over.
"""
from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path

import pytest

from course_lib import check_choice, check_number
from course_lib.fault_tolerance.interval import (LLAMA3, expected_waste, interval_summary,
                                                 job_mtbf, per_gpu_failure_rate, simulate_waste,
                                                 young_daly_interval)
from course_lib.fault_tolerance.training import Fault, format_faults, parse_faults
from course_lib.fault_tolerance.show import format_interval

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "fault_harness.py"


def _harness():
    spec = importlib.util.spec_from_file_location("fault_harness", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fault_harness"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_young_daly_is_the_minimum_of_expected_waste():
    cost, mtbf = 60.0, 3 * 3600.0
    tau = young_daly_interval(cost, mtbf)
    assert tau == math.sqrt(2 * 60 * 10800)
    best = expected_waste(tau, cost, mtbf)
    for factor in (0.5, 0.9, 1.1, 2.0):
        assert expected_waste(factor * tau, cost, mtbf) > best
    assert math.isclose(cost / tau, tau / (2 * mtbf))  # both terms equal at the optimum


def test_llama3_figures():
    rate = per_gpu_failure_rate()
    assert math.isclose(job_mtbf(LLAMA3["gpus"], rate) / 3600, 54 * 24 / 419)  # ~3.09 h
    summary = interval_summary()  # Llama 3 scale with 30 s saves and 2 min restarts
    assert summary["effective"] > LLAMA3["effective_time"]
    assert "16,384 GPUs" in format_interval(16384, 0.173, 30, 120)


def test_simulated_waste_agrees_with_first_order_formula():
    # The formula counts C/τ of *work*; the simulation counts lost *wall-clock* time and
    # failures during saves and restarts, so they agree to first order only: 10 % relative
    # near the optimum, where C and τ are small against M (seen: 3-4 %).
    cost, mtbf, restart = 30.0, 11135.0, 120.0
    tau = young_daly_interval(cost, mtbf)
    measured = simulate_waste(tau, cost, mtbf, restart, seed=1)
    assert measured == pytest.approx(expected_waste(tau, cost, mtbf, restart), rel=0.10)
    assert simulate_waste(tau / 8, cost, mtbf, restart, seed=1) > measured
    assert simulate_waste(tau * 8, cost, mtbf, restart, seed=1) > measured


@pytest.mark.parametrize("call, message", [
    (lambda: young_daly_interval(0, 10), "cost_s must be a positive number"),
    (lambda: job_mtbf(16384, -1.0), "rate_per_gpu_s must be a positive number"),
    (lambda: expected_waste(10, 1, 100, restart_s=-1), "restart_s must be >= 0"),
    (lambda: parse_faults("0:1:kill"), "expected attempt:rank:step:kind"),
    (lambda: Fault(0, 1, 3, "explode"), "fault kind must be one of"),
    (lambda: Fault(0, -1, 3), "Fault.rank must be a non-negative integer"),
])
def test_bad_input_gives_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_fault_plan_round_trip():
    faults = (Fault(0, 1, 5, "kill"), Fault(1, 0, 9, "save"))
    assert parse_faults(format_faults(faults)) == faults
    assert parse_faults("") == ()


def test_exercise_checks():
    tau = young_daly_interval(120, 4 * 3600) / 60
    assert not check_number(120 * 4 * 60, tau, rtol=0.02)  # C·M, forgot the root
    assert check_number(math.sqrt(2 * 120 * 4 * 3600) / 60, tau, rtol=0.02)
    options = ["step_000004", "step_000006", "step_000006.tmp", "none"]
    assert not check_choice("step_000006.tmp", "step_000004", options)
    assert check_choice("step_000004", "step_000004", options)


def test_random_plans_are_reachable():
    harness = _harness()
    rng = random.Random(0)
    for _ in range(200):
        plan = harness.random_plan(rng, 12, 3, 2, 3)
        steps = [s for _, _, s in plan]
        assert steps == sorted(set(steps)), plan  # strictly increasing: each fault is reached
        assert all(s % 3 == 0 for k, _, s in plan if k == "save"), plan


def test_torchrun_restarts_lose_nothing(tmp_path):
    harness = _harness()
    rng = random.Random()
    steps, every = 6, 2
    ref = harness.reference("tiny", steps, 0, 2)
    # one torchrun trial (each attempt costs seconds of process start-up): a rank dies in the
    # middle of a save. Kills, raises and outside SIGKILLs under torchrun are exercised by the
    # 20-trial harness (benchmarks/fault_harness.py) and, through course_lib.run, by
    # tests/fault_tolerance/test_checkpoint.py.
    plans = [[("save", rng.randrange(2), rng.choice([2, 4]))]]
    for plan in plans:
        result = harness.run_trial(plan, ref, steps=steps, every=every, workdir=str(tmp_path))
        assert result.passed, f"plan {plan}: {result.reason}"
        assert result.restarts == 1
