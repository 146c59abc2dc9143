"""Chapter 02: DDP's overlap over a shaped link — overlapped step vs one all-reduce after backward.

Two pinned ranks in network namespaces joined by a veth that ``tc`` holds to 500 Mbit/s: the
gradients' bytes take real wire time while the cores stay free for backward. Needs namespaces
(root or user namespaces); skipped with the reason elsewhere, but must run in CI as root. The
bounds are shares of times measured in the same run, not absolute times.
"""
from __future__ import annotations

import os

import pytest

import course_lib
from course_lib.data_parallel import overlap as ov
from course_lib.launcher import netns, shaped_link
from course_lib.launcher.devices import usable_cores

#: What the test asserts: overlap hides at least this share of min(compute, comm), the most the
#: model lets it hide — the notebook's verdict band (``ov.HIDDEN_AT_LEAST``). Hidden = comm -
#: (overlapped - compute), each a timer's reading; the serial step (one DDP bucket, the same
#: reducer work, `overlap_models`) must pay for the communication. Known runs: 16 % and 30 %
#: (docs/decisions/data-parallel.md, "How overlap is measured: like with like").
HIDDEN_AT_LEAST = ov.HIDDEN_AT_LEAST


def _must_run() -> bool:
    required = os.environ.get("CI") == "true" or os.environ.get("COURSE_REQUIRE_NETNS") == "1"
    return required and os.geteuid() == 0


@pytest.fixture(scope="module")
def measured():
    mode, why = netns.availability()
    if mode is None:
        if _must_run():
            pytest.fail(f"CI runs as root, so the shaped link must work here, but: {why}")
        pytest.skip(f"network namespaces not available here: {why}")
    if usable_cores() < 2:
        pytest.skip("the overlap needs 2 usable cores (one per rank)")
    return ov.measure_overlap(rate_mbit=500, bucket_cap_mb=1, steps=5)


def test_overlapped_step_beats_the_serial_one_by_a_share_of_what_it_could_hide(measured):
    m = measured
    assert not m["shared_core"] and m["cores"][0] != m["cores"][1]
    wire_floor = 4 * m["n_params"] * 8 / 500e6  # each rank sends 4Ψ bytes at p = 2
    assert m["comm_s"] >= 0.8 * wire_floor, m  # the link, not the CPU, sets the all-reduce time
    busy = m["core_share"] < ov.MIN_CORE_SHARE  # CI's loaded rerun: busy loops on both cores
    verdict = ov.overlap_verdict(m)
    if busy:
        assert "other programs took the cores" in verdict, m
        pytest.skip(f"the ranks had their core {m['core_share']:.0%} of the time (measured): "
                    "a busy machine, the overlap cannot be judged")
    assert m["step_serial_s"] >= m["compute_s"] + 0.5 * m["comm_s"], m  # serial pays for comm
    most = min(m["compute_s"], m["comm_s"])  # the model's largest saving
    assert m["hidden_s"] >= HIDDEN_AT_LEAST * most, m
    assert "as predicted" in verdict and "not as predicted" not in verdict, (verdict, m)


def test_the_verdict_counts_only_what_overlap_hid_not_the_serial_steps_extra_copies():
    # The run chapter 02 once printed as "saved 19 ms, 39 %, as predicted": its serial step paid a
    # torch.cat and a copy-back the overlapped one did not; by the timers overlap hid 71.2 -
    # (111.6 - 48.0) = 7.6 ms, 16 % of min(compute, comm) = 48 ms.
    m = {"compute_s": 0.0480, "comm_s": 0.0712, "step_serial_s": 0.1303,
         "step_overlapped_s": 0.1116, "core_share": 0.99}
    verdict = ov.overlap_verdict(m)
    assert "hid 8 of 71 ms" in verdict and "16% of the most" in verdict, verdict
    assert "19 ms" not in verdict and "39%" not in verdict, verdict
    low = ov.overlap_verdict({**m, "step_overlapped_s": 0.1170})  # hid 2.2 ms, 5 %
    assert "not as predicted" in low and "below the 10%" in low, low
    fast = ov.overlap_verdict({**m, "step_overlapped_s": 0.0650})  # beats max(compute, comm)
    assert "faster than the model allows" in fast, fast


def test_the_serial_step_is_one_bucket_and_both_keep_gradients_as_bucket_views():
    def rank_fn():
        import torch
        import torch.nn.functional as F
        model, whole = ov.overlap_models(ov.OVERLAP_SIZES, 1.0)
        x, y = torch.randn(8, ov.OVERLAP_SIZES[0]), torch.randn(8, ov.OVERLAP_SIZES[-1])
        for _ in range(2):  # DDP rebuilds its buckets after the first step
            for ddp in (model, whole):
                F.mse_loss(ddp(x), y).backward()
        storages = [len({p.grad.untyped_storage().data_ptr() for p in ddp.parameters()})
                    for ddp in (model, whole)]
        same = all(torch.equal(a, b) for a, b in zip(model.parameters(), whole.parameters()))
        return storages, same

    (storages, same), = course_lib.run(rank_fn, 1)
    assert storages[1] == 1, storages  # every gradient a view of the serial step's one bucket
    assert storages[0] >= 4, storages  # 4.2 MB in 1 MiB buckets
    assert same  # the two models start from the same weights


def test_derived_numbers_come_from_the_four_timers(measured):
    m = measured
    assert m["exposed_comm_s"] == pytest.approx(max(0.0, m["step_overlapped_s"] - m["compute_s"]))
    assert m["hidden_s"] == pytest.approx(max(0.0, m["comm_s"] - m["exposed_comm_s"]))
    assert m["hidden_share"] == pytest.approx(min(1.0, m["hidden_s"] / m["comm_s"]))
    assert m["predicted_serial_s"] == pytest.approx(m["compute_s"] + m["comm_s"])
    with pytest.warns(DeprecationWarning, match="course_lib.measure_overlap is deprecated"):
        assert course_lib.measure_overlap is ov.measure_overlap   # chapter 05 no longer uses it


@pytest.mark.parametrize("kwargs, message", [
    (dict(rate_mbit=-1), "rate_mbit must be a finite number >= 0"),
    (dict(rate_mbit=float("nan")), "rate_mbit must be"),
    (dict(bucket_cap_mb=0), "bucket_cap_mb must be a finite number > 0"),
    (dict(steps=0), "steps must be a positive integer"),
    (dict(sizes=(8,)), "sizes"),
])
def test_bad_input_fails_before_any_process(monkeypatch, kwargs, message):
    monkeypatch.setattr(shaped_link, "run_pair", lambda *a, **k: pytest.fail("a process started"))
    monkeypatch.setattr(netns, "availability", lambda **k: pytest.fail("probed the system"))
    with pytest.raises(ValueError, match=message):
        ov.measure_overlap(**kwargs)


def test_no_namespace_is_a_clear_error_before_any_process(monkeypatch):
    monkeypatch.setattr(shaped_link, "availability", lambda: (None, "no permission here"))
    monkeypatch.setattr(shaped_link.subprocess, "Popen", lambda *a, **k: pytest.fail("started"))
    with pytest.raises(netns.LinkUnavailable, match="no permission here"):
        ov.measure_overlap()


def test_targets_must_name_a_course_function():
    for bad in ("os:system", "course_lib.x", "course_lib.a:b; rm", 3):
        with pytest.raises(ValueError, match="target must name a course_lib function"):
            shaped_link.run_pair(bad, [(0, {})])


def test_ranks_get_a_core_each_when_there_are_two_and_share_one_otherwise():
    assert [shaped_link._cores_of(r, 1, [4, 7]) for r in (0, 1)] == [[4], [7]]
    assert [shaped_link._cores_of(r, 1, [3]) for r in (0, 1)] == [[3], [3]]


def test_the_verdict_says_when_one_core_spoils_the_experiment():
    m = {"step_overlapped_s": 0.3, "step_serial_s": 0.31, "compute_s": 0.2, "comm_s": 0.1,
         "hidden_share": 0.0, "predicted_overlapped_floor_s": 0.2, "predicted_serial_s": 0.3}
    assert "not as predicted" in ov.overlap_verdict(m)
    assert "needs 2 usable cores" in ov.overlap_verdict({**m, "shared_core": True})
