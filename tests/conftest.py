"""Shared fixtures (no rank left behind) and two markers, each list in one place:

* ``clock`` (``CLOCK``): a deadline, a race, a signal or a kill at some moment decides the outcome.
  It must hold on a busy 2-core machine: CI runs these, and only these, while two busy loops
  occupy both cores (``COURSE_CLOCK_UNDER_LOAD=2``, tests/under_load.py); locally
  ``bash .ci/loaded python -m pytest -m clock tests`` does the same.
* ``timed`` (``TIMED``): compares measured times (the speed lessons). It needs the cores to itself
  and skips, saying why, on a busy machine; CI runs it without load.

``tests/test_clock_marker.py`` checks that every entry names a test that exists.
"""
from __future__ import annotations

import pytest

from processes import rank_processes, wait_gone

CLOCK = (
    # the launcher: timeouts, Stop at random moments, kills, concurrent launches, torchrun agents
    "tests/launcher/test_launch.py",
    "tests/launcher/test_launch_big_results.py",
    "tests/launcher/test_diagnose.py",
    "tests/launcher/test_launch_children.py",
    "tests/launcher/test_launch_interrupts.py",
    "tests/launcher/test_progress.py",
    "tests/launcher/test_rank_error.py",
    "tests/launcher/test_rank_reports.py",
    "tests/launcher/test_torchrun.py",
    "tests/launcher/test_torchrun_store.py",
    "tests/launcher/test_forked_workers.py",
    "tests/launcher/test_warm_start.py",
    "tests/launcher/test_idle_server.py",
    "tests/launcher/test_results.py",
    "tests/launcher/test_by_name.py",
    # deadlines, and kills at a moment
    "tests/communication/test_ring.py::test_a_deadlock_is_reported_after_the_patience_not_hung",
    "tests/communication/test_multinode.py::test_two_node_run_equals_one_process",
    "tests/communication/test_multinode.py::test_both_nodes_meet_in_one_private_network",
    "tests/fault_tolerance/test_checkpoint.py::test_crash_during_save_keeps_previous_checkpoint",
    "tests/fault_tolerance/test_checkpoint.py::test_resume_after_fault_at_random_step_equals_uninterrupted",
    "tests/fault_tolerance/test_fault.py::test_torchrun_restarts_lose_nothing",
    "tests/capstone/test_resume.py::test_killed_rank_resumes_to_the_same_weights_bit_for_bit",
    "tests/scripts/test_train_script.py::test_torchrun_restarts_a_killed_rank_and_the_run_ends_bit_identical",
    "tests/capstone/test_cluster.py::test_the_generated_command_runs_as_two_loopback_nodes",
    "tests/communicating_less/test_replicas.py::test_the_survivor_counts_every_step",
    "tests/communicating_less/test_replicas.py::test_the_rejoined_replica_equals_its_peer",
    # the autograder's time limits and the kernel it interrupts or kills
    "tests/classroom/test_session.py",
    "tests/classroom/test_grader.py::test_a_crash_a_deleted_folder_a_deadlock_and_a_failing_rank_fail_only_their_exercise",
)

# Tests that measure times and compare them (speed lessons): they need the cores to themselves,
# run where nothing else does, and skip with the reason when the machine is busy; not under load.
TIMED = (
    "tests/communication/test_comm.py::test_benchmark_measures_every_collective",
    "tests/communication/test_comm.py::test_compare_ring_reports_times_and_equal_results",
    "tests/communication/test_comm.py::test_measured_all_reduce_rows_feed_the_fit",
    "tests/communication/test_comm.py::test_scaling_rows_are_consistent",
    "tests/communication/test_comm.py::test_core_wait_is_wall_minus_cpu_per_thread_and_the_table_labels_both_modes",
    "tests/communication/test_comm.py::test_pinning_gives_each_rank_its_own_core",
    "tests/communication/test_link_sweep.py::test_a_slow_link_stretches_the_step",
    "tests/data_parallel/test_overlap.py::test_overlapped_step_beats_the_serial_one_by_a_share_of_what_it_could_hide",
    "tests/communication/test_scaling_link.py::test_the_speedup_falls_as_the_link_slows",
    "tests/communication/test_scaling_link.py::test_each_speedup_lies_within_the_alpha_beta_band",
    "tests/communication/test_link_sweep.py::test_each_throttled_step_is_within_the_stated_factor_of_alpha_beta",
    "tests/pipeline_parallel/test_pipeline.py::test_measured_bubble_budget_is_consistent",
    "tests/pipeline_parallel/test_torch_schedules.py::test_torch_schedule_equals_unsplit_model_and_measures_a_bubble",
    "tests/pipeline_parallel/test_bubble.py::test_bubble_falls_with_m_and_starts_on_the_formula",
    "tests/pipeline_parallel/test_bubble.py::test_a_schedule_that_does_not_pipeline_is_not_as_predicted",
    "tests/debugging/test_debugging.py::test_the_straggler_is_the_slowed_rank_in_compute_not_in_step_time",
    "tests/common/test_timeline.py::test_real_ranks_spans_overlap_and_every_bucket_is_seen",
    "tests/debugging/test_straggler_timeline.py::test_the_slowed_rank_is_named_and_the_others_wait_in_a_collective",
    "tests/sharding/test_fsdp_timeline.py::test_ddp_step_shows_a_bucket_issued_before_the_first_layer_is_done",
    "tests/capstone/test_train_gpt.py::test_throughput_and_mfu_are_measured",
    "tests/capstone/test_train_gpt.py::test_step_prediction_is_built_from_the_machine_constants",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "clock: the outcome involves deadlines, kills at a moment or "
                            "races: it must hold under load (see tests/conftest.py)")
    config.addinivalue_line("markers", "timed: compares measured times; skips on a busy machine")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(item.nodeid == entry or item.nodeid.startswith(entry + "::")
               or item.nodeid.startswith(entry + "[") for entry in CLOCK):
            item.add_marker(pytest.mark.clock)
        if any(item.nodeid == entry or item.nodeid.startswith(entry + "[") for entry in TIMED):
            item.add_marker(pytest.mark.timed)


@pytest.fixture
def no_leftover_ranks():
    yield
    leftovers = [p.pid for p in rank_processes()]
    assert wait_gone(leftovers) == [], f"processes left behind: {leftovers}"


@pytest.fixture(autouse=True)
def _close_figures():
    """A test's pyplot figures are closed after it (they would pile up over the session)."""
    yield
    import sys
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
