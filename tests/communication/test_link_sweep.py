"""Chapter 5: the link sweep — a real step over a shaped veth, wire bytes and time vs α-β.

The live sweep needs network namespaces (root, or unprivileged user namespaces); where neither
works it is skipped with the reason — except in CI as root (``CI=true`` or
``COURSE_REQUIRE_NETNS=1``), where it must run. Timing checks only use bounds that a busy
machine cannot break by itself: a slow link's transfer time is a floor, and the prediction is
built on the unthrottled step measured in the same run, under the same load.
"""
from __future__ import annotations

import json
import os

import pytest

import course_lib
from course_lib import devices
from course_lib.communication import link_sweep_gpu as gpu
from course_lib.communication import link_sweep_record as rec
from course_lib.common.models import mlp_param_count

from course_lib.communication import link_sweep as ls
PSI = mlp_param_count(ls.DEFAULT_SIZES)


def _must_run() -> bool:
    required = os.environ.get("CI") == "true" or os.environ.get("COURSE_REQUIRE_NETNS") == "1"
    return required and os.geteuid() == 0


@pytest.fixture(scope="module")
def sweep():
    mode, why = ls.availability()
    if mode is None:
        if _must_run():
            pytest.fail(f"CI runs as root, so the link sweep must run here, but: {why}")
        pytest.skip(f"network namespaces not available here: {why}")
    rows = ls.link_sweep([0, 100], device="cpu")
    return {(r.rate_mbit, r.strategy): r for r in rows}


def test_a_slow_link_stretches_the_step(sweep):
    for strategy in ("ddp", "fsdp"):
        fast, slow = sweep[0, strategy], sweep[100, strategy]
        transfer = slow.predicted_s - slow.base_s  # bytes / (100 Mbit/s)
        assert transfer > fast.step_s  # the point of the setting: the link dominates
        assert slow.step_s >= fast.step_s + 0.5 * transfer, (strategy, fast, slow)
        assert slow.step_s >= 1.5 * fast.step_s, (strategy, fast, slow)


def test_bytes_on_the_wire_match_the_prediction(sweep):
    """The veth's counter (payload + TCP/IP headers + acks) within 10 % of the formula."""
    ddp_bytes = 2 * (2 - 1) / 2 * 4 * PSI  # ring all-reduce of the fp32 gradients
    for (rate, strategy), row in sweep.items():
        assert row.bytes_source == "veth tx_bytes"
        assert row.predicted_bytes == pytest.approx(ddp_bytes * (1 if strategy == "ddp" else 2))
        assert abs(row.sent_bytes / row.predicted_bytes - 1) <= 0.10, row
    for rate in (0, 100):  # gloo: reduce-scatter sends what an all-reduce sends, so 2x, not 1.5x
        ratio = sweep[rate, "fsdp"].sent_bytes / sweep[rate, "ddp"].sent_bytes
        assert ratio == pytest.approx(2.0, rel=0.10)
    # what the collectives were handed (CommCounter), independent of the wire
    assert sweep[0, "ddp"].payload_bytes == {"all_reduce": 4 * PSI}
    assert sweep[0, "fsdp"].payload_bytes == {"all_gather": 2 * 4 * PSI, "reduce_scatter": 4 * PSI}


def test_each_throttled_step_is_within_the_stated_factor_of_alpha_beta(sweep):
    lo, hi = ls.STEP_FACTOR
    for (rate, strategy), row in sweep.items():
        if rate:
            assert lo <= row.ratio <= hi, row
    assert all(rec.verdicts(list(sweep.values())).values())


def test_a_failing_node_is_named_with_its_traceback():
    mode, why = ls.availability()
    if mode is None:
        pytest.skip(f"network namespaces not available here: {why}")
    opts = {"sizes": [8, 8], "batch": 2, "steps": 1, "rates": [0], "latency_ms": 0,
            "strategies": ["zero9"], "threads": 1}  # past link_sweep's checks: fails in the nodes
    with pytest.raises(RuntimeError, match=r"(?s)node [01] exited with code 1.*Traceback.*"
                                           r"unknown strategy 'zero9'"):
        ls._run_hub(mode, opts, timeout=120)


def test_latency_needs_netem():
    mode, why = ls.availability(latency=True)
    if mode is None:
        assert "netem" in why or ls.availability()[0] is None
        pytest.skip(f"no delay on this machine: {why}")
    rows = ls.link_sweep([1000], ("ddp",), latency_ms=1.0, device="cpu")
    (row,) = rows
    assert row.latency_ms == 1.0 and "+1 ms" in row.link
    assert ls.STEP_FACTOR[0] <= row.ratio <= ls.STEP_FACTOR[1], row


@pytest.mark.parametrize("args, kwargs, error, message", [
    ([[]], {}, ValueError, "rates_mbit is empty"),
    ([100], {}, TypeError, "sequence of rates"),
    ([[0, -5]], {}, ValueError, "finite number of Mbit/s >= 0"),
    ([[float("nan")]], {}, ValueError, "finite number of Mbit/s"),
    ([[0, float("inf")]], {}, ValueError, "finite number of Mbit/s"),
    ([[0], ("ddp", "zero9")], {}, ValueError, "unknown strategies"),
    ([[0]], {"latency_ms": -1}, ValueError, "latency_ms must be a finite number >= 0"),
    ([[0]], {"steps": 0}, ValueError, "steps must be an integer >= 1"),
    ([[0]], {"steps": 2.5}, ValueError, "steps must be an integer >= 1"),
    ([[0]], {"sizes": (8,)}, ValueError, "MLP sizes"),
    ([[0]], {"batch": 0}, ValueError, "batch must be an integer >= 1"),
    ([[0]], {"device": "tpu"}, ValueError, "device must be None, 'cpu' or 'cuda'"),
])
def test_bad_input_fails_before_any_process(monkeypatch, args, kwargs, error, message):
    monkeypatch.setattr(ls, "_run_hub", lambda *a, **k: pytest.fail("a process started"))
    monkeypatch.setattr(ls, "availability", lambda **k: pytest.fail("probed the system"))
    with pytest.raises(error, match=message):
        course_lib.link_sweep(*args, **kwargs)


def test_no_namespaces_raise_a_clear_error_and_the_notebook_falls_back(monkeypatch):
    monkeypatch.setattr(ls, "availability", lambda latency=False: (None, "no permission here"))
    monkeypatch.setattr(ls, "_run_hub", lambda *a, **k: pytest.fail("a process started"))
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    with pytest.raises(course_lib.LinkSweepUnavailable, match="no permission here") as info:
        course_lib.link_sweep([0, 100])
    assert info.value.reason == "no permission here"
    rows, source = rec.live_or_recorded()
    assert rows == rec.load_recorded() and len(rows) >= 4
    assert source.startswith("no permission here") and "RECORDED on another machine" in source


def test_availability_says_why(monkeypatch):
    monkeypatch.setattr(ls.shutil, "which", lambda tool, path=None: None)
    mode, why = ls.availability()
    assert mode is None and "not found" in why and "iproute2" in why
    monkeypatch.setattr(ls.sys, "platform", "darwin")
    assert ls.availability() == (None, "network namespaces are Linux-only")


def test_recorded_sweep_is_labelled_and_consistent():
    rows = rec.load_recorded()
    meta = rows.meta
    assert {"cpu", "cores", "torch", "date", "command"} <= set(meta)
    assert "benchmarks/record_link_sweep.py" in meta["command"]
    assert rows.label.startswith("RECORDED on another machine")
    assert {(r.rate_mbit, r.strategy) for r in rows} >= {(0, "ddp"), (100, "fsdp")}
    assert all(rec.verdicts(rows).values()), rec.verdicts(rows)


def test_recorded_file_is_checked_field_by_field(tmp_path):
    good = json.loads(rec.RECORDED_PATH.read_text())
    good["rows"][0]["__reduce__"] = "os.system"
    bad = tmp_path / "sweep.json"
    bad.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="a row has fields"):
        rec.load_recorded(bad)


def test_verdicts_catch_a_step_far_from_its_prediction():
    rows = rec.load_recorded()
    slow = max((r for r in rows if r.strategy == "ddp"), key=lambda r: r.rate_mbit)
    broken = [r if r is not slow else ls.LinkRow(**{**vars(r), "step_s": 10 * r.predicted_s})
              for r in rows]
    assert not all(rec.verdicts(broken).values())


def test_predicted_bytes_ring_and_gloo():
    assert ls.predicted_bytes("ddp", 1000, world=4) == pytest.approx(2 * 3 / 4 * 4000)
    nccl = ls.predicted_bytes("fsdp", 1000, world=4, backend="nccl")
    assert nccl / ls.predicted_bytes("ddp", 1000, world=4) == pytest.approx(1.5)
    assert ls.predicted_bytes("fsdp", 1000, backend="gloo") / ls.predicted_bytes("ddp", 1000) == 2
    assert ls.predicted_step(0.1, 12.5e6, 100) == pytest.approx(1.1)  # 100 Mbit = 12.5 MB/s
    assert ls.predicted_step(0.1, 1e6, 0) == 0.1
    assert ls.predicted_step(0, 0, 0, 2.0, {"all_reduce": 3, "all_gather": 1}) == \
        pytest.approx((3 * 2 + 1) * 2e-3)


def _fake_rank(strategies, steps, sizes, batch, timeout):
    """What two GPU ranks would report (a stand-in for the NCCL run)."""
    psi = mlp_param_count(sizes)
    payload = {"ddp": {"all_reduce": 4 * psi},
               "fsdp": {"all_gather": 8 * psi, "reduce_scatter": 4 * psi}}
    return [{s: {"times": [0.002] * steps, "compute_s": 0.001, "tx": None,
                 "calls": {k: 1 for k in payload[s]}, "payload": payload[s]} for s in strategies}
            for _ in range(2)]


def test_gpu_path_measures_the_real_link_only(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    monkeypatch.setattr(gpu, "_launch", _fake_rank)
    monkeypatch.setattr(ls, "availability", lambda **k: pytest.fail("namespaces on GPUs"))
    with pytest.warns(UserWarning, match="NVLink/PCIe link only"):
        rows = course_lib.link_sweep([0, 1000, 100])
    assert [(r.rate_mbit, r.strategy, r.link) for r in rows] == [
        (0, "ddp", gpu.LINK), (0, "fsdp", gpu.LINK)]
    ddp, fsdp = rows
    assert ddp.sent_bytes == 4 * PSI and fsdp.sent_bytes == 6 * PSI  # the rings' shares
    assert fsdp.predicted_bytes / ddp.predicted_bytes == pytest.approx(1.5)  # NCCL
    assert ddp.bytes_source.startswith("CommCounter")


def _phases(sizes):
    from course_lib.communication._link_node import strategy_phase

    return {s: strategy_phase(s, sizes, 4, 1, 0) for s in ("ddp", "fsdp")}


def test_the_phase_code_of_the_gpu_path_runs_in_plain_ranks():
    """The rank code gpu_sweep runs, on 2 CPU ranks of course_lib.run (no namespace, no wire
    counter): CommCounter sees DDP's all-reduce of every gradient, FSDP's two all-gathers and
    one reduce-scatter of the whole model."""
    sizes = [8, 16, 8]
    psi = mlp_param_count(sizes)
    for rank in course_lib.run(_phases, 2, sizes):
        assert rank["ddp"]["tx"] is None and len(rank["ddp"]["times"]) == 1
        assert rank["ddp"]["payload"] == {"all_reduce": 4 * psi}
        assert rank["fsdp"]["payload"] == {"all_gather": 8 * psi, "reduce_scatter": 4 * psi}
        assert rank["fsdp"]["calls"] == {"all_gather": 2 * 2, "reduce_scatter": 2}


def test_cuda_without_two_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    monkeypatch.setattr(gpu, "_launch", lambda *a: pytest.fail("a process started"))
    with pytest.raises(ValueError, match="needs 2 GPUs .* this machine has 1"):
        course_lib.link_sweep([0], device="cuda")


def test_figure_shows_every_row_and_fsdp_extra_cost():
    import matplotlib
    matplotlib.use("Agg")
    from course_lib.communication.show import plot_link_sweep

    rows = rec.load_recorded()
    fig = plot_link_sweep(rows)
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted(round(r.step_s * 1e3, 6) for r in rows)
    slow = [r for r in rows if r.rate_mbit == min(x.rate_mbit for x in rows if x.rate_mbit)]
    ratio = next(r for r in slow if r.strategy == "fsdp").sent_bytes / next(
        r for r in slow if r.strategy == "ddp").sent_bytes
    assert any(f"({ratio:.1f}x the bytes)" in t.get_text() for t in ax.texts)


@pytest.mark.skipif(devices.gpu_count() < 2, reason="needs 2 CUDA GPUs")
def test_gpu_path_for_real():
    rows = course_lib.link_sweep([0])
    ddp, fsdp = rows
    assert ddp.sent_bytes == pytest.approx(4 * PSI, rel=0.01)
    assert fsdp.sent_bytes / ddp.sent_bytes == pytest.approx(1.5, rel=0.05)
