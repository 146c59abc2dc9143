"""Chapter 11's local SGD on real ranks: with an SGD inner step, H = 1 and a plain average it
is DDP with SGD (and a single process that averages both ranks' gradients); its bytes per step
are one all-reduce of the model per H steps; the outer-step exercise's check catches mistakes."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.common.models import MLP
from course_lib.communicating_less import exercises
from course_lib.communicating_less.measure import SEED, SIZES, compare_local_sgd, \
    local_sgd_rank, task_batch
from course_lib.launcher.launch import run

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")
STEPS, LR = 3, 0.05   # later, one ReLU flipped by a rounding difference amplifies it
ATOL = 1e-7          # the pseudo-gradient θ - (θ - ηg) rounds at ~1 ulp of θ (7e-9) per step


def _local_and_ddp(STEPS=STEPS):
    from torch.nn.parallel import DistributedDataParallel
    local = local_sgd_rank([1], STEPS, inner="sgd", inner_lr=LR, outer_lr=1.0, momentum=0.0)
    torch.manual_seed(SEED)
    ddp = DistributedDataParallel(MLP(SIZES))
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = task_batch(step, dist.get_rank())
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    return local[0]["params"], [p.detach().clone() for p in ddp.parameters()]


def _single_process(STEPS=STEPS):
    torch.manual_seed(SEED)
    model = MLP(SIZES)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        sum(F.mse_loss(model(x), y) for x, y in (task_batch(step, r) for r in range(2))).div(2) \
            .backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_h1_sgd_plain_average_is_ddp():
    reference = _single_process()
    for local, ddp in run(_local_and_ddp, 2):
        for a, b, c in zip(local, ddp, reference):
            torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
            torch.testing.assert_close(a, c, rtol=0, atol=ATOL)


def test_bytes_fall_with_h():
    rows = compare_local_sgd((1, 4), steps=8)
    for row in rows:
        assert row["sent"] == pytest.approx(row["predicted_sent"], rel=0.05)
    assert rows[1]["sent"] < 0.3 * rows[0]["sent"]


def _summed(model, global_params, outer_opt):
    delta = [g - p.detach() for g, p in zip(global_params, model.parameters())]
    for g, d in zip(global_params, delta):
        dist.all_reduce(d)
        g.grad = d
    outer_opt.step()
    with torch.no_grad():
        for p, g in zip(model.parameters(), global_params):
            p.copy_(g)


def test_exercise_check_passes_the_reference_and_fails_a_sum():
    from course_lib.communicating_less.local_sgd import outer_step
    assert exercises.check_outer_step(outer_step)[0]
    ok, message = exercises.check_outer_step(_summed)
    assert not ok and "scale" in message


def test_exercise_2_asks_for_four_ranks():
    from course_lib.communicating_less.exercises import check_bytes_per_step
    assert "PASS" in repr(check_bytes_per_step(4 * 102_928 * 2 * 3 / 4 / 8))
    assert "PASS" not in repr(check_bytes_per_step(4 * 102_928 * 2 * 1 / 2 / 8))  # 2 ranks' answer
