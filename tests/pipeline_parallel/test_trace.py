"""The schedule runs without instruments; the trace is applied from outside (``TracedSteps``) and
records what ran, in the order it ran, without changing a number."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_lib.common.data import get_batch
from course_lib.common.models import GPT
from course_lib.launcher.launch import run
from course_lib.pipeline_parallel.measure import PP_CONFIG
from course_lib.pipeline_parallel.schedules import Stage, StageSteps, run_schedule, schedule_ops
from course_lib.pipeline_parallel.trace import StageTrace, TracedSteps

M, BATCH = 4, 8


def _plain_and_traced(schedule: str) -> dict:
    """On each rank: one step with the plain StageSteps, one with TracedSteps, same start."""
    rank, p = dist.get_rank(), dist.get_world_size()
    idx, targets = get_batch(BATCH, PP_CONFIG.seq_len, seed=0)
    shape = (BATCH // M, PP_CONFIG.seq_len, PP_CONFIG.d_model)
    out = {}
    for name in ("plain", "traced"):
        torch.manual_seed(0)
        stage = Stage(GPT(PP_CONFIG), rank, p)
        trace = StageTrace(rank)
        steps = (StageSteps(stage, list(targets.chunk(M))) if name == "plain"
                 else TracedSteps(stage, list(targets.chunk(M)), trace))
        loss = run_schedule(steps, schedule, list(idx.chunk(M)), shape)
        out[name] = {"loss": loss, "grads": {n: q.grad.clone() for n, q in stage.named_parameters()},
                     "events": [(k, i) for k, i, _, _ in trace.events],
                     "waits": [(k, i) for k, i, _, _ in trace.waits], "stash": trace.stash_peak_count,
                     "timed": all(a <= b for _, _, a, b in trace.events + trace.waits)}
    return out


@pytest.fixture(scope="module", params=["gpipe", "1f1b"])
def ranks(request):
    return request.param, run(_plain_and_traced, 2, request.param, threads=1)


def test_tracing_changes_no_number(ranks):
    _, results = ranks
    for rank, r in enumerate(results):
        assert r["plain"]["loss"] == r["traced"]["loss"] and (r["plain"]["loss"] is None) == (rank == 0)
        for name, g in r["plain"]["grads"].items():
            assert torch.equal(g, r["traced"]["grads"][name]), name


def test_the_trace_records_what_ran_in_order(ranks):
    schedule, results = ranks
    for rank, r in enumerate(results):
        assert r["plain"]["events"] == [] and r["plain"]["stash"] == 0   # nothing inside the loop
        traced = r["traced"]
        assert traced["events"] == schedule_ops(schedule, 2, M, rank) and traced["timed"]
        # rank 0 waits for the gradients of its backwards, rank 1 for the activations of its forwards
        assert traced["waits"] == [("B" if rank == 0 else "F", i) for i in range(M)]
        assert traced["stash"] == (M if schedule == "gpipe" else 2 - rank)


class _Logged(StageSteps):
    """StageSteps that logs each posted receive and each compute, in the order they happen."""

    def __init__(self, stage, micro_targets):
        super().__init__(stage, micro_targets)
        self.log = []

    def post(self, kind, i, shape, src):
        self.log.append(("post", kind, i))
        super().post(kind, i, shape, src)

    def forward(self, i, x):
        self.log.append(("compute", "F", i))
        return super().forward(i, x)

    def backward(self, i, y, grad):
        self.log.append(("compute", "B", i))
        super().backward(i, y, grad)


def _logged(schedule: str) -> list:
    rank, p = dist.get_rank(), dist.get_world_size()
    idx, targets = get_batch(BATCH, PP_CONFIG.seq_len, seed=0)
    torch.manual_seed(0)
    steps = _Logged(Stage(GPT(PP_CONFIG), rank, p), list(targets.chunk(M)))
    run_schedule(steps, schedule, list(idx.chunk(M)), (BATCH // M, PP_CONFIG.seq_len, PP_CONFIG.d_model))
    return steps.log


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_rank_posts_its_next_receive_before_it_computes(schedule):
    """gloo moves a message only into a posted receive: a receive posted when the tensor is
    needed waits for the sender's core to be free (docs/decisions/pipeline-bubble.md, "Why each
    rank posts its next receive before it computes"), so it is posted one
    action ahead, once, in the order the rank will take them."""
    for rank, log in enumerate(run(_logged, 2, schedule, threads=1)):
        order = schedule_ops(schedule, 2, M, rank)
        needed = [op for op in order if op[0] == ("B" if rank == 0 else "F")]
        assert [entry[1:] for entry in log if entry[0] == "post"] == needed
        for at, entry in enumerate(log):
            if entry[0] != "compute":
                continue
            later = [op for op in order[order.index(entry[1:]) + 1:] if op in needed]
            posted = {e[1:] for e in log[:at] if e[0] == "post"}
            assert not later or later[0] in posted, (rank, entry, log[:at])
