"""Chapter 10's tools on real ranks: the divergence checker names the first tensor that differs
(checked against a comparison of the ranks' state in this process), each drift cause shows where
it should under torch's own DDP with its default buffer sync, the Flight Recorder tells on gloo
which collectives retired, the NaN flag stops the step on every rank, the straggler is the
slowed rank."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_lib.debugging import divergence, exercises, health
from course_lib.debugging.measure import drift_ranks, drift_run, nan_run, small_model, straggler_run
from course_lib.launcher.launch import run

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def _checker_and_states():
    rank = dist.get_rank()
    out = []
    for case in exercises.CASES:
        model = exercises._model(case, rank)
        out.append((divergence.first_divergence(model),
                    [(n, t.clone()) for n, t in divergence.named_state(model)]))
    return out


@pytest.fixture(scope="module")
def checker_runs():
    return run(_checker_and_states, 2)


def test_first_divergence_names_the_first_tensor_that_differs(checker_runs):
    for case, (r0, r1) in zip(exercises.CASES, zip(*checker_runs)):
        differ = [n for (n, a), (_, b) in zip(r0[1], r1[1]) if not torch.equal(a, b)]
        want = (differ[0], [1]) if differ else None
        assert r0[0] == r1[0] == want, case
    assert [r[0] for r in checker_runs[0]] == [None, ("0.weight", [1]), ("1.running_mean", [1]),
                                               ("0.bias", [1])]


def test_the_hash_sees_a_swap_that_a_sum_misses():
    a = torch.arange(6.0)
    b = a.clone()
    b[0], b[1] = a[1], a[0]
    assert a.sum() == b.sum() and divergence.tensor_hash(a) != divergence.tensor_hash(b)
    assert divergence.tensor_hash(a) == divergence.tensor_hash(a.clone())
    assert divergence.tensor_hash(a) != divergence.tensor_hash(a.view(2, 3))  # shape counts


@pytest.mark.parametrize("cause,want", [
    ("none", [None] * 3),
    ("dropout_seed", [None] * 3),  # different masks, averaged gradients: the weights stay equal
    ("seed", [("0.weight", [1])] * 3),
    ("buffer", [None] + [("1.running_mean", [1])] * 2),
    ("one_rank_step", [None] + [("0.weight", [1])] * 2),
])
def test_each_drift_cause_is_found_where_it_starts(cause, want):
    assert drift_run(cause, steps=2) == want


def test_a_bad_cause_fails_before_any_process_starts():
    with pytest.raises(ValueError, match="cause must be one of"):
        drift_run("cosmic ray")
    with pytest.raises(ValueError, match="where must be"):
        drift_run("none", where="later")


def test_under_ddp_defaults_buffers_differ_right_after_a_step_and_agree_at_the_next_forward():
    # DDP broadcasts rank 0's buffers at the start of forward, not after backward: checked right
    # after optimizer.step(), each rank's running_mean holds its own batch's update
    assert drift_run("none", steps=2, where="after_step") == [None] + [("1.running_mean", [1])] * 2
    assert drift_run("none", steps=2, where="forward") == [None] * 3


def test_one_rank_step_skips_exactly_one_step_and_the_lag_stays():
    ranks = drift_ranks("one_rank_step", steps=3)
    assert [r["optimizer_steps"] for r in ranks] == [3, 2]
    assert ranks[0]["seen"] == [None] + [("0.weight", [1])] * 3


def _ddp_buffer_arguments():
    import warnings
    from torch.nn.parallel import DistributedDataParallel as DDP
    seen = {}
    for name, kwargs in (("default", {}), ("broadcast_buffers", {"broadcast_buffers": True}),
                         ("forward_sync_buffers", {"forward_sync_buffers": False})):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = DDP(small_model(), **kwargs)
        seen[name] = ([w.category.__name__ for w in caught if "buffers" in str(w.message)],
                      model.forward_sync_buffers)
    return seen


def test_broadcast_buffers_is_deprecated_and_forward_sync_buffers_defaults_to_true():
    seen = run(_ddp_buffer_arguments, 2)[0]
    assert seen == {"default": ([], True), "broadcast_buffers": (["FutureWarning"], True),
                    "forward_sync_buffers": ([], False)}


def _flight_record():
    import os
    import pickle
    import time
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        dist.broadcast(t, src=1, async_op=True)  # rank 1 never sends: pending on rank 0
    assert os.environ.get("TORCH_FR_BUFFER_SIZE") == "64"
    for _ in range(100):  # a finished collective is marked retired a moment after it returns
        record = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
        if all(e["retired"] for e in record["entries"][:2]):
            break
        time.sleep(0.05)
    return [(e["collective_seq_id"], e["profiling_name"], e["state"], e["retired"])
            for e in record["entries"]]


def test_the_flight_recorder_on_gloo_marks_finished_collectives_retired(monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    r0, r1 = run(_flight_record, 2)
    done = [(1, "gloo:all_reduce", "scheduled", True), (2, "gloo:all_reduce", "scheduled", True)]
    assert r1 == done
    assert r0 == done + [(3, "gloo:broadcast", "scheduled", False)]  # entered, never finished


def test_the_nan_flag_skips_the_step_on_every_rank_and_names_the_rank():
    guarded = nan_run(bad_rank=1, bad_step=1, steps=3)
    assert [r["skipped"] for r in guarded] == [[[], [1], []]] * 2
    assert all(r["weights_finite"] for r in guarded)
    unguarded = nan_run(bad_rank=1, bad_step=1, steps=3, guard=False)
    assert not any(r["weights_finite"] for r in unguarded)  # the all-reduce spread it to rank 0


def test_the_straggler_is_the_slowed_rank_in_compute_not_in_step_time():
    rows = straggler_run(slow_rank=1, delay=0.2, steps=3)
    for compute, step in rows:
        assert health.stragglers(compute) == [1]
        assert compute[1] >= 0.2
        assert step[0] >= 0.2  # rank 0 waited in the all-reduce for rank 1


def _sum_checker(model):
    sums = torch.tensor([float(t.sum()) for _, t in divergence.named_state(model)])
    other = sums.clone()
    dist.broadcast(other, 0)
    differ = [n for (n, _), a, b in zip(divergence.named_state(model), sums, other) if a != b]
    return differ[0] if differ else None


def test_the_exercise_check_passes_the_solution_and_fails_a_sum():
    solution = lambda model: (divergence.first_divergence(model) or [None])[0]  # noqa: E731
    assert exercises.check_checker(solution)[0]
    ok, message = exercises.check_checker(_sum_checker)
    assert not ok and message.startswith("two entries swapped"), message


def test_check_diagnosis():
    assert exercises.check_diagnosis(2, "waits on a different group").passed
    assert not exercises.check_diagnosis(0, "waits on a different group").passed
    assert not exercises.check_diagnosis(2, "shapes differ").passed
    assert not exercises.check_diagnosis(..., ...).passed


def test_the_drift_widget_offers_every_cause_and_prints_what_the_checker_found(capsys):
    from course_lib.debugging.measure import CAUSES
    from course_lib.debugging.show import drift_widget

    widget = drift_widget()
    cause, steps = widget.children[:2]
    assert list(cause.options) == list(CAUSES) and cause.value == "buffer"
    capsys.readouterr()
    widget.update()  # what a change of the dropdown calls: real ranks, then the checker's lines
    text = "".join(o.get("text", "") for o in widget.out.outputs) or capsys.readouterr().out
    assert "cause: buffer" in text and "running_mean" in text, text
