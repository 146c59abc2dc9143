"""Out of memory on one rank, on real ranks: the budget stops the rank that went over, names the
category that grew and tells a leak (tensors alive from earlier steps) from a larger batch; the
healthy run's tracked peak equals chapter 01's prediction; a real allocator failure (the rank's
address space capped with ``setrlimit``) gets a one-line summary."""
from __future__ import annotations

import resource

import pytest
import torch
import torch.distributed as dist

from course_lib.debugging.oom import OverBudget, oom_run, predicted_peaks
from course_lib.launcher.launch import RankError, run

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")
BUDGET = 10 * 2**20


def test_a_healthy_run_stays_under_the_budget_and_its_peak_is_the_prediction():
    ranks = oom_run("none", BUDGET, steps=2)
    for got, want in zip(ranks, predicted_peaks("none")):
        assert got["steps"] == 2 and got["peak"] <= BUDGET
        assert abs(got["peak"] - want) <= 0.01 * want  # the batches loaded up front: +8 KiB


def test_a_larger_batch_on_one_rank_stops_that_rank_in_its_first_forward():
    peaks = predicted_peaks("big_batch")
    assert peaks[0] < BUDGET < peaks[1]  # the predictor says so before the run
    with pytest.raises(RankError) as info:
        oom_run("big_batch", BUDGET)
    err = info.value
    assert (err.rank, err.exc_type) == (1, "OverBudget")
    first = str(err).splitlines()[0]
    assert "rank 1 went over its memory budget of 10.00 MiB in step 1 forward" in first
    assert "activations grew the most" in first and "earlier steps" not in first


def test_a_leak_is_told_by_what_was_alive_before_the_step():
    assert all(p < BUDGET for p in predicted_peaks("leak"))  # the predictor cannot see a leak
    with pytest.raises(RankError) as info:
        oom_run("leak", BUDGET, steps=8)
    err = info.value
    assert (err.rank, err.exc_type) == (1, "OverBudget")
    first = str(err).splitlines()[0]
    assert "in step 1 " not in first and "activations grew the most" in first
    assert "alive before this step's forward: something keeps tensors from earlier steps" in first


def test_over_budget_names_the_largest_growth():
    err = OverBudget(1, 100, 120, "step 2 backward", {"params": 0, "grads": 60, "activations": 20},
                     {"activations": 0})
    assert err.category == "grads" and "grads grew the most (+60 B)" in str(err)
    assert "earlier steps" not in str(err)


def test_bad_choices_fail_before_any_process_starts():
    with pytest.raises(ValueError, match="cause must be one of"):
        oom_run("cosmic ray")
    with pytest.raises(ValueError, match="budget"):
        oom_run("none", budget=-1)
    with pytest.raises(ValueError, match="nprocs"):
        predicted_peaks("none", nprocs=1)


def _allocate_under_a_cap():
    if dist.get_rank() == 1:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (size + 64 * 2**20, hard))
        try:
            torch.empty(256 * 2**20, dtype=torch.uint8)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    return 0


def test_a_real_allocator_failure_gets_one_line():
    with pytest.raises(RankError) as info:
        run(_allocate_under_a_cap, 2)
    assert info.value.rank == 1
    assert info.value.summary == ("rank 1 ran out of memory: the CPU allocator could not get "
                                  "256.00 MiB more (what it held: chapter 01's tracker, chapter "
                                  "10's BudgetTracker)")
    assert str(info.value).splitlines()[0] == info.value.summary
