"""Megatron-core tensor parallelism (chapter 4): ColumnParallelLinear / RowParallelLinear on the
course block vs the dense block, the hand-written TP and DTensor; Megatron-LM's parallel sizes;
the fallback when megatron-core cannot be imported."""
from __future__ import annotations

import sys

import pytest
import torch

from course_lib.launcher.launch import RunReport
from course_lib.tensor_parallel import megatron
from course_lib.tensor_parallel.megatron import (FLAG_CHAPTERS, compare_megatron, megatron_layout,
                                                 megatron_status, tp_with_fallback)

# fp32; the sums over heads / hidden units are split across ranks and re-added by all-reduce, so
# they round differently from the dense block: observed <= 4.8e-7 on O(1) outputs and <= 3e-9 on
# gradients of size ~1e-3 (the same tolerances as tests/tensor_parallel/test_tensor_parallel.py).
OUT_TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-4, atol=1e-7)
# Megatron-core vs the hand-written block and DTensor: the same shards and all-reduces in the same
# order — bitwise equal with this machine's default kernels, but one fused addmm against mm + add
# rounds differently under other kernels (ATEN_CPU_CAPABILITY=default: 1.3e-7 on an output of
# 8e-3), so the outputs get the dense comparison's fp32 tolerance.
SAME_TOL = OUT_TOL

OK, REASON = megatron_status()
needs_megatron = pytest.mark.skipif(not OK, reason=REASON)


@pytest.fixture(scope="module")
def runs():
    """One launch at t=2 (Megatron, hand, DTensor) and one at t=4 (Megatron, hand)."""
    exits = RunReport()
    two = compare_megatron(2, run_report=exits)
    return {2: two, 4: compare_megatron(4, compare=("hand",))}, exits


@needs_megatron
@pytest.mark.parametrize("t", [2, 4])
def test_megatron_core_equals_dense_forward_and_backward(runs, t):
    reports = [r["megatron"] for r in runs[0][t]]
    assert [r.rank for r in reports] == list(range(t))
    for r in reports:
        torch.testing.assert_close(r.output, r.dense_output, **OUT_TOL)
        torch.testing.assert_close(r.input_grad, r.dense_input_grad, **GRAD_TOL)
        assert len(r.grads) == 10
        for name, (shard, dense_slice) in r.grads.items():
            torch.testing.assert_close(shard, dense_slice, **GRAD_TOL, msg=lambda m: f"{name}: {m}")


@needs_megatron
@pytest.mark.parametrize("t", [2, 4])
def test_megatron_core_equals_hand_and_dtensor(runs, t):
    for per_impl in runs[0][t]:
        mega = per_impl["megatron"]
        others = [impl for impl in per_impl if impl != "megatron"]
        assert others == (["hand", "dtensor"] if t == 2 else ["hand"])
        for impl in others:
            other = per_impl[impl]
            torch.testing.assert_close(mega.output, other.output, **SAME_TOL)
            torch.testing.assert_close(mega.input_grad, other.input_grad, **GRAD_TOL)
            for name, (shard, _) in mega.grads.items():
                torch.testing.assert_close(shard, other.grads[name][0], **GRAD_TOL,
                                           msg=lambda m: f"{impl} {name}: {m}")


@needs_megatron
def test_megatron_core_traffic_memory_and_clean_exit(runs):
    by_t, exits = runs
    b, s, h = 2, 32, 64
    for t, reports in by_t.items():
        for r in reports:
            mega = r["megatron"]
            # the byte counter sees megatron's own all-reduces: the same 2 + 2 as the hand version
            assert mega.comm_calls == {"forward": 2, "backward": 2}
            assert mega.comm_bytes == {"forward": 2 * b * s * h * 4, "backward": 2 * b * s * h * 4}
            assert mega.param_bytes == r["hand"].param_bytes
            assert mega.param_bytes["split"] * t == 12 * h * h * 4 + (3 * h + 4 * h) * 4
    assert exits.exit_statuses == [0, 0]     # parallel_state destroyed, ranks ended cleanly


@pytest.mark.parametrize("args, kwargs, expected", [
    ((8, 2, 2), {}, (2, None)),
    ((2, 2), {}, (1, None)),                                     # what chapter 4 ran
    ((64, 8, 4), dict(micro_batch_size=1, global_batch_size=64, sequence_parallel=True), (2, 32)),
    ((4,), dict(micro_batch_size=2, global_batch_size=16), (4, 2)),
])
def test_megatron_layout(args, kwargs, expected):
    layout = megatron_layout(*args, **kwargs)
    assert (layout.dp, layout.micro_batches) == expected
    assert layout.world == layout.tp * layout.pp * layout.dp
    table = layout.table()
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel"):
        assert flag in table and flag in FLAG_CHAPTERS
    assert ("micro-batches = global" in table) == (expected[1] is not None)


@pytest.mark.parametrize("args, kwargs, message", [
    ((6, 4), {}, r"world size 6 is not divisible by --tensor-model-parallel-size 4 x "
                 r"--pipeline-model-parallel-size 1 = 4: Megatron-LM needs world = TP x PP x DP"),
    ((8, 2, 3), {}, r"= 6: Megatron-LM needs world = TP x PP x DP"),
    ((4, 1), dict(sequence_parallel=True), r"--sequence-parallel .* needs --tensor-model-parallel-size > 1"),
    ((8, 2), dict(micro_batch_size=3, global_batch_size=16),
     r"--global-batch-size 16 is not divisible by --micro-batch-size 3 x data-parallel size 4 = 12"),
    ((8, 2), dict(micro_batch_size=1), "give both --micro-batch-size and --global-batch-size"),
    ((0,), {}, "world size must be a positive integer"),
    ((8, 2.0), {}, "--tensor-model-parallel-size must be a positive integer"),
])
def test_megatron_layout_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        megatron_layout(*args, **kwargs)


def test_fallback_when_megatron_cannot_be_imported(monkeypatch):
    """Simulate a missing megatron-core module: the status (asked of one rank) says why, the
    Megatron run refuses before its ranks start, and the notebook's path continues with the
    hand-written and DTensor TP."""
    monkeypatch.setattr(megatron, "_MODULES", (*megatron._MODULES, "megatron.core.no_such_module"))
    ok, reason = megatron_status()
    assert not ok
    assert reason.startswith("megatron-core is not usable here (ModuleNotFoundError: No module "
                             "named 'megatron.core.no_such_module')")
    assert "Falling back to the hand-written Megatron-style TP and DTensor" in reason
    with pytest.raises(RuntimeError, match=r"megatron-core is not usable here"):
        compare_megatron(2, timeout=0.001)          # would time out if its 2 ranks started
    ok, fallback_reason, per_rank = tp_with_fallback(2)
    assert (ok, fallback_reason) == (False, reason)
    assert [sorted(r) for r in per_rank] == [["dtensor", "hand"]] * 2
    for r in per_rank:
        for report in r.values():
            torch.testing.assert_close(report.output, report.dense_output, **OUT_TOL)


@needs_megatron
def test_this_process_never_imports_megatron_core():
    """The status and the runs leave megatron-core to the ranks (and the warm server that forks
    them): chapter 4's kernel stays free of its seconds-long import."""
    if any(name == "megatron" or name.startswith("megatron.") for name in sys.modules):
        pytest.skip("megatron-core was imported in this process by another test")
    megatron_status()
    compare_megatron(2, compare=())
    assert not [name for name in sys.modules if name == "megatron" or name.startswith("megatron.")]


@pytest.mark.parametrize("kwargs, message", [
    (dict(t=3), "n_head=4 is not divisible"),
    (dict(compare=("megatron",)), "compare may name 'hand' and 'dtensor' only"),
])
def test_bad_megatron_request_fails_before_start(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compare_megatron(**kwargs, timeout=0.001)


def test_notebook_exercise():
    from course_lib import check_number
    expected = megatron_layout(128, 8, 4, micro_batch_size=2, global_batch_size=512).micro_batches
    assert check_number(512 // (2 * (128 // (8 * 4))), expected)    # the solution: 64
    assert not check_number(512 // 2, expected)                     # forgot the data-parallel split
    assert not check_number(128 // (8 * 4), expected)               # the DP size, not micro-batches
