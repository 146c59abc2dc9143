"""Chapter 5: collective benchmark, hand-written ring all-reduce, α-β fit, what-if, scaling."""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from course_lib.communication import benchmark as comm
from course_lib.communication import ring
from course_lib.common import machine
from course_lib.communication.alphabeta import (FIT_TOLERANCE, AlphaBeta, fit_alpha_beta,
                                                fit_errors, fit_per_world, measure_all_reduce,
                                                points_of, ring_allreduce_time, within_tolerance)
from course_lib.communication.benchmark import (CollectiveResult, benchmark_collectives,
                                                busbw_factor)
from course_lib.launcher.launch import run
from course_lib.communication.ring import ring_all_reduce
from course_lib.communication.scaling import measure_scaling
from course_lib.communication.whatif import LINKS, Link, predict_step
from course_lib.communication.show import whatif_widget


# ---- busbw arithmetic (nccl-tests doc/PERFORMANCE.md) -------------------------------------
@pytest.mark.parametrize("collective, world, busbw", [
    ("all_reduce", 4, 2.0 * 2 * 3 / 4),       # 2(n-1)/n
    ("all_reduce", 2, 2.0 * 1.0),
    ("all_gather", 8, 2.0 * 7 / 8),           # (n-1)/n
    ("reduce_scatter", 4, 2.0 * 3 / 4),
    ("broadcast", 8, 2.0),                    # 1
    ("all_to_all", 4, 2.0 * 3 / 4),           # (n-1)/n: each rank keeps 1/n of its buffer
    ("reduce", 4, 2.0),                       # 1
])
def test_busbw_matches_nccl_tests_definitions(collective, world, busbw):
    row = CollectiveResult(collective, world, size_bytes=10**9, seconds=0.5, iters=1,
                           backend="gloo")
    assert row.algbw == pytest.approx(2.0)  # 1e9 B / 0.5 s = 2 GB/s
    assert row.busbw == pytest.approx(busbw)


def test_busbw_factor_of_one_rank_is_zero_traffic():
    assert busbw_factor("all_reduce", 1) == 0.0


@pytest.mark.parametrize("kwargs, words", [
    (dict(collectives=["all_to_one"]), "unknown collective"),
    (dict(sizes=[1024, 0]), "positive"),
    (dict(sizes=[-5]), "positive"),
    (dict(world=1), "world size"),
    (dict(iters=0), "iters"),
])
def test_bad_benchmark_input_fails_before_any_process(monkeypatch, kwargs, words):
    monkeypatch.setattr(comm, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=words):
        benchmark_collectives(**kwargs)


def test_ring_needs_two_ranks_before_any_process(monkeypatch):
    monkeypatch.setattr(ring, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match="world size"):
        ring.compare_ring(world=1)
    with pytest.raises(ValueError, match="positive"):
        ring.compare_ring(sizes=[0])


def test_benchmark_measures_every_collective():
    rows = benchmark_collectives(sizes=[4096, 65536], world=2, iters=2)
    assert [(r.collective, r.size_bytes) for r in rows] == [
        (c, s) for c in comm.COLLECTIVES for s in (4096, 65536)]
    assert all(r.seconds > 0 and r.world == 2 and r.iters == 2 for r in rows)
    table = comm.format_table(rows, ceiling_gbps=comm.memcopy_bandwidth(2**20, 2))
    assert "reduce_scatter" in table and "64 KiB" in table and "ceiling" in table
    more = benchmark_collectives(comm.MORE_COLLECTIVES, sizes=[4096], world=2, iters=2)
    assert [r.collective for r in more] == ["reduce", "all_to_all"]
    assert all(r.size_bytes == 4096 and r.seconds > 0 for r in more)


# ---- the hand-written ring -----------------------------------------------------------------
SIZES = [1, 2, 3, 5, 64, 1000, 1003, 4099]  # several not divisible by 2, 3 or 4


def _ring_vs_torch(sizes):
    rank = dist.get_rank()
    out = []
    for n in sizes:
        data = torch.randn(n, generator=torch.Generator().manual_seed(1000 * n + rank))
        mine, theirs = data.clone(), data.clone()
        assert ring_all_reduce(mine) is mine  # in place, like dist.all_reduce
        dist.all_reduce(theirs)
        out.append((mine, theirs))
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_all_reduce_equals_dist_all_reduce(world):
    results = run(_ring_vs_torch, world, SIZES)
    for n, (mine, theirs) in zip(SIZES, results[0]):
        exact = sum(torch.randn(n, generator=torch.Generator().manual_seed(1000 * n + r))
                    for r in range(world))
        torch.testing.assert_close(mine, theirs)
        torch.testing.assert_close(mine, exact)
    for other in results[1:]:  # every rank ends with the same tensor
        for (a, _), (b, _) in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_ring_rejects_non_contiguous_tensor():
    def fn():
        with pytest.raises(ValueError, match="contiguous"):
            ring_all_reduce(torch.zeros(4, 4).t())
        return True
    assert run(fn, 2) == [True, True]


def test_compare_ring_reports_times_and_equal_results():
    rows = ring.compare_ring(sizes=[4096, 2**18], world=2, iters=2)
    assert [r["bytes"] for r in rows] == [4096, 2**18]
    assert all(r["ring_s"] > 0 and r["torch_s"] > 0 and r["max_abs_diff"] < 1e-5 for r in rows)


# ---- α-β model -----------------------------------------------------------------------------
def _synthetic(alpha, beta, noise=()):
    pts = [(p, n, ring_allreduce_time(n, p, alpha, beta))
           for p in (2, 4, 8) for n in (2**10, 2**14, 2**18, 2**22, 2**26)]
    return [(p, n, t * (1 + (noise[i % len(noise)] if noise else 0)))
            for i, (p, n, t) in enumerate(pts)]


def test_fit_recovers_known_alpha_beta():
    fit = fit_alpha_beta(_synthetic(50e-6, 1 / 10e9))
    assert fit.alpha == pytest.approx(50e-6, rel=1e-9)
    assert fit.bandwidth_gbps == pytest.approx(10.0, rel=1e-9)


def test_fit_is_robust_to_small_noise():
    fit = fit_alpha_beta(_synthetic(20e-6, 1 / 2e9, noise=(0.03, -0.02, 0.01, -0.03)))
    assert fit.alpha == pytest.approx(20e-6, rel=0.05)
    assert fit.beta == pytest.approx(1 / 2e9, rel=0.05)


def test_fit_keeps_parameters_non_negative():
    pts = [(2, n, 1e-3) for n in (2**10, 2**16, 2**20)]  # flat: pure latency
    fit = fit_alpha_beta(pts)
    assert fit.beta == 0.0 and fit.alpha == pytest.approx(0.5e-3)
    assert math.isinf(fit.bandwidth_gbps)


def test_fit_rejects_bad_points():
    with pytest.raises(ValueError, match="at least 2"):
        fit_alpha_beta([(2, 1024, 1e-3)])
    with pytest.raises(ValueError, match="p >= 2"):
        fit_alpha_beta([(1, 1024, 1e-3), (1, 2048, 2e-3)])
    with pytest.raises(ValueError, match="separate"):
        fit_alpha_beta([(2, 1024, 1e-3), (2, 1024, 1e-3)])


def test_tolerance_check_can_fail():
    assert within_tolerance([0.1, -0.2, 0.3])
    assert not within_tolerance([0.1, 0.1, 1.5])            # one point off by > 2x
    assert not within_tolerance([-0.6, 0.1, 0.1])           # 0.4x is also off by > 2x
    assert not within_tolerance([0.5, -0.4, 0.45])          # median 45 % > 35 %


def test_fit_of_exact_synthetic_rows_reproduces_them_and_the_tolerance_catches_a_bad_point():
    """The measured path (rows -> points -> fit per world -> errors) on exact synthetic rows.

    How well a fit matches *measured* times depends on the machine's load: that figure is printed
    by ``benchmarks/bench_collectives.py``, never asserted here.
    """
    alpha, beta = 40e-6, 1 / 1.5e9
    sizes = (2**12, 2**15, 2**18, 2**21, 2**23)
    rows = [CollectiveResult("all_reduce", p, n, ring_allreduce_time(n, p, alpha, beta), 3, "gloo")
            for p in (2, 4) for n in sizes]
    rows.append(CollectiveResult("broadcast", 2, 2**12, 1.0, 3, "gloo"))  # not an all-reduce
    fits = fit_per_world(rows)
    assert sorted(fits) == [2, 4]
    for p, fit in fits.items():
        assert fit.alpha == pytest.approx(alpha, rel=1e-6)
        assert fit.beta == pytest.approx(beta, rel=1e-6)
        errors = fit_errors(fit, [pt for pt in points_of(rows) if pt[0] == p])
        assert len(errors) == len(sizes) and max(map(abs, errors)) < 1e-6
        assert within_tolerance(errors, FIT_TOLERANCE)
        # one point 3x slower than the model (a stall) must fail the stated tolerance
        assert not within_tolerance(errors[:-1] + [1 / 3 - 1], FIT_TOLERANCE)


def test_measured_all_reduce_rows_feed_the_fit():
    """A real measurement goes through the same path; only load-proof properties are checked."""
    sizes = (2**12, 2**16)
    rows = measure_all_reduce(worlds=(2,), sizes=sizes, repeats=1)
    assert [(r.collective, r.world, r.size_bytes) for r in rows] == [
        ("all_reduce", 2, n) for n in sizes]
    assert all(r.seconds > 0 for r in rows)
    fit = fit_per_world(rows)[2]
    assert fit.alpha >= 0 and fit.beta >= 0 and fit.alpha + fit.beta > 0
    errors = fit_errors(fit, points_of(rows))
    assert errors == [fit.all_reduce(n, 2) / r.seconds - 1 for n, r in zip(sizes, rows)]


# ---- what-if -------------------------------------------------------------------------------
def test_predict_step_by_hand():
    link = Link("test", bandwidth_gbps=10.0, alpha=0.0)
    ddp = predict_step(1e9, 4, "ddp", link, bytes_per_element=2)
    assert ddp.comm_bytes_per_gpu == pytest.approx(2 * 3 / 4 * 2e9)  # 2Ψ·(p-1)/p bytes
    assert ddp.comm_s == pytest.approx(0.3)
    assert predict_step(1e9, 4, "zero2", link).comm_s == pytest.approx(ddp.comm_s)
    assert predict_step(1e9, 4, "fsdp", link).comm_s == pytest.approx(1.5 * ddp.comm_s)
    compute = 6 * 1e9 * 8 * 2048 / (989e12 * 0.4)
    assert ddp.compute_s == pytest.approx(compute)
    assert ddp.step_s == pytest.approx(compute + 0.3)
    assert ddp.efficiency == pytest.approx(compute / (compute + 0.3))
    hidden = predict_step(1e9, 4, "ddp", link, overlap=1.0)
    assert hidden.step_s == pytest.approx(max(compute, 0.3))
    assert predict_step(1e9, 1, "ddp", link).efficiency == 1.0


def test_predict_step_uses_slowest_link_across_nodes():
    inside = predict_step(7e9, 8, "ddp", "NVLink 4 (H100)")
    across = predict_step(7e9, 16, "ddp", "NVLink 4 (H100)", inter_node="100 GbE")
    assert inside.link == "NVLink 4 (H100)" and across.link == "100 GbE"
    assert across.efficiency < inside.efficiency
    assert LINKS["NVLink 4 (H100)"].bandwidth_gbps == 450.0  # 900 GB/s bidirectional


@pytest.mark.parametrize("kwargs", [dict(strategy="zero4"), dict(link="carrier pigeon"),
                                    dict(gpus=0), dict(mfu=0.0)])
def test_predict_step_rejects_bad_input(kwargs):
    with pytest.raises(ValueError):
        predict_step(**{"params": 1e9, "gpus": 8, **kwargs})


def test_whatif_widget_updates_its_table():
    pytest.importorskip("ipywidgets")
    box = whatif_widget(params_b=7.0)
    before = box.children[-1].value
    assert "7.00 B params" in before and "ddp" in before
    box.children[0].children[1].value = "fsdp"
    assert box.children[-1].value != before and "fsdp" in box.children[-1].value


# ---- DDP scaling ---------------------------------------------------------------------------
def test_scaling_rows_are_consistent():
    rows = measure_scaling(worlds=(1, 2), global_batch=16, batch_per_rank=8,
                           sizes=(16, 64, 8), steps=1)
    assert [(r.mode, r.world, r.batch_per_rank) for r in rows] == [
        ("strong", 1, 16), ("strong", 2, 8), ("weak", 1, 8), ("weak", 2, 8)]
    for r in rows:
        assert r.step_s > 0 and r.compute_s > 0 and r.comm_s >= 0
        assert r.compute_cpu_s > 0 and r.core_wait_s >= 0 and not r.pinned
        if r.world == 1:
            assert r.speedup == 1.0 and r.efficiency == 1.0 and r.allreduce_s == 0.0
        else:
            assert r.allreduce_s > 0
    strong2, weak2 = rows[1], rows[3]
    assert strong2.efficiency == pytest.approx(strong2.speedup / 2)
    assert weak2.speedup == pytest.approx(weak2.efficiency * 2)


def test_core_wait_is_wall_minus_cpu_per_thread_and_the_table_labels_both_modes():
    from course_lib.communication.scaling import ScalingRow, format_scaling
    row = ScalingRow("strong", 2, 2, 8, step_s=0.5, compute_s=0.4, allreduce_s=0.1, speedup=1.0,
                     efficiency=0.5, compute_cpu_s=0.6)
    assert row.core_wait_s == pytest.approx(0.4 - 0.6 / 2)
    weak = ScalingRow("weak", 1, 1, 8, 0.1, 0.1, 0.0, 1.0, 1.0, compute_cpu_s=0.2)
    assert weak.core_wait_s == 0.0                      # never negative
    table = format_scaling([row, weak])
    assert table.startswith("strong scaling: the global batch is split")
    assert "\nweak scaling: every rank keeps its batch" in table and table.count("core wait") == 2


def _pinned(threads):
    import os

    from course_lib.communication.scaling import pin_cores
    return pin_cores(dist.get_rank(), threads), sorted(os.sched_getaffinity(0))


def test_pinning_gives_each_rank_its_own_core():
    import os
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    (a, mask_a), (b, mask_b) = run(_pinned, 2, 1, threads=1)
    assert a == mask_a and b == mask_b and len(a) == len(b) == 1 and a != b


def test_pinning_more_ranks_than_cores_fails_before_starting(monkeypatch):
    import course_lib.communication.scaling as scaling
    monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("a process was started"))
    monkeypatch.setattr(scaling.os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(ValueError, match="pin=True gives every rank its own cores: 4 ranks need 4"):
        measure_scaling(worlds=(1, 4), threads=1, pin=True)


def test_pinning_counts_the_cgroup_quota_not_only_the_affinity_mask(monkeypatch):
    """A pod with 2 cores in its mask and a 1-CPU quota cannot pin 2 ranks."""
    import course_lib.communication.scaling as scaling
    monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("a process was started"))
    monkeypatch.setattr(scaling.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(machine, "cgroup_cpu_quota", lambda *paths: 1.0)
    with pytest.raises(ValueError, match="2 ranks need 2 cores, this process may use 1"):
        measure_scaling(worlds=(1, 2), threads=1, pin=True)


@pytest.mark.parametrize("kwargs", [dict(worlds=(2, 4)), dict(worlds=(1, 3), global_batch=16),
                                    dict(worlds=(1, 64)), dict(steps=0)])
def test_scaling_rejects_bad_input_before_starting(monkeypatch, kwargs):
    import course_lib.communication.scaling as scaling
    monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError):
        measure_scaling(**kwargs)


def test_alpha_beta_str_and_bandwidth():
    fit = AlphaBeta(alpha=1e-4, beta=1e-9)
    assert fit.bandwidth_gbps == pytest.approx(1.0)
    assert "100.0 µs" in str(fit)


def test_one_rank_rows_count_no_communication_and_the_reducer_is_taken_out():
    # Chapter 05's one-rank rows once showed 2.7-3.7 ms of "comm" with no partner: DDP's own
    # work (bucket copies, a one-rank all-reduce) counted as communication.
    from course_lib.communication.scaling import ScalingRow, format_scaling, scaling_cause
    one = ScalingRow("strong", 1, 1, 128, step_s=0.0202, compute_s=0.0165, allreduce_s=0.0,
                     speedup=1.0, efficiency=1.0, compute_cpu_s=0.0165, reducer_s=0.0037)
    two = ScalingRow("strong", 2, 1, 64, step_s=0.0231, compute_s=0.0121, allreduce_s=0.0058,
                     speedup=0.87, efficiency=0.44, compute_cpu_s=0.0121, reducer_s=0.0037)
    assert one.sync_s == pytest.approx(0.0037) and one.comm_s == 0.0
    assert two.sync_s == pytest.approx(0.0110) and two.comm_s == pytest.approx(0.0073)
    table = format_scaling([one, two]).splitlines()
    assert "sync" in table[1] and "comm" in table[1]
    assert table[2].split()[7:9] == ["3.7", "0.0"], table[2]
    assert "exposed communication 7.3 ms" in scaling_cause([one, two])
