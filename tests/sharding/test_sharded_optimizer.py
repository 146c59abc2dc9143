"""ShardedOptimizer on real ranks == the plain optimizer on one process == ZeroRedundancyOptimizer.

A small net with what a student's model has and the course GPT lacks: a frozen layer and a
layer that never gets a gradient (both must stay untouched, as torch's optimizers leave them),
AdamW with weight decay, SGD with momentum, two param groups with different lr and weight decay,
bf16 parameters. 12 rows per step split among 2 or 3 ranks (3: the flat buffer is padded and
shards cut through parameters).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from course_lib import run
from course_lib.sharding.zero_by_hand import ShardedOptimizer

STEPS, ROWS = 3, 12


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.frozen = nn.Linear(16, 16).requires_grad_(False)
        self.out = nn.Linear(16, 4)
        self.unused = nn.Linear(16, 4)            # never in forward: its grad stays None

    def forward(self, x):
        return self.out(torch.tanh(self.frozen(torch.tanh(self.inp(x)))))


def two_groups(model):
    return [{"params": [*model.inp.parameters(), *model.frozen.parameters()], "lr": 3e-2},
            {"params": [*model.out.parameters(), *model.unused.parameters()], "weight_decay": 0.0}]


SCENARIOS = {
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}, None, torch.float32),
    "sgd-momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, None, torch.float32),
    "two groups": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}, two_groups, torch.float32),
    "bf16": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, None, torch.bfloat16),
}


def _net(dtype):
    torch.manual_seed(0)
    return Net().to(dtype)


def _batch(step, dtype, rank=0, world=1):
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(ROWS, 8, generator=gen), torch.randn(ROWS, 4, generator=gen)
    return x.to(dtype).chunk(world)[rank], y.to(dtype).chunk(world)[rank]


def _train(model, opt, steps, dtype, rank, world, average=False, first_step=0):
    for step in range(first_step, first_step + steps):
        x, y = _batch(step, dtype, rank, world)
        opt.zero_grad()
        nn.functional.mse_loss(model(x).float(), y.float()).backward()
        if average:                                # torch's ZeRO leaves averaging to DDP
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _scenarios():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, (cls, kwargs, groups, dtype) in SCENARIOS.items():
        params = lambda m: groups(m) if groups else m.parameters()
        row = {"initial": {n: p.detach().clone() for n, p in _net(dtype).named_parameters()}}
        for stage in (1, 2):
            model = _net(dtype)
            opt = ShardedOptimizer(params(model), cls, stage=stage, **kwargs)
            row[stage] = _train(model, opt, STEPS, dtype, rank, world)
            row[f"lr{stage}"] = [g["lr"] for g in opt.param_groups]
        model = _net(dtype)
        row["torch"] = _train(model, ZeroRedundancyOptimizer(params(model), cls, **kwargs),
                              STEPS, dtype, rank, world, average=True)
        model = _net(dtype)
        row["plain"] = _train(model, cls(params(model), **kwargs), STEPS, dtype, 0, 1)
        out[name] = row
    out["resume"] = _resume(rank, world)
    out["scheduled"] = {}
    for name, (shard, w, r) in {"sharded": (True, world, rank), "plain": (False, 1, 0)}.items():
        model = _net(torch.float32)
        opt = (ShardedOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-2) if shard
               else torch.optim.AdamW(model.parameters(), lr=1e-2))
        schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
        for step in range(STEPS):                # an lr schedule writes into param_groups
            _train(model, opt, 1, torch.float32, r, w, first_step=step)
            schedule.step()
        out["scheduled"][name] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def _resume(rank, world):
    """Two steps, state_dict, one more; against: a fresh optimizer loads it and does the third."""
    model = _net(torch.float32)
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-2)
    _train(model, opt, 2, torch.float32, rank, world)
    saved, weights = copy.deepcopy(opt.state_dict()), copy.deepcopy(model.state_dict())
    x, y = _batch(2, torch.float32, rank, world)

    def third(model, opt):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    uninterrupted = third(model, opt)
    fresh = _net(torch.float32)
    fresh.load_state_dict(weights)
    reopened = ShardedOptimizer(fresh.parameters(), torch.optim.AdamW, stage=2, lr=5.0)
    reopened.load_state_dict(saved)
    refused = None
    try:
        ShardedOptimizer(_net(torch.float32).parameters(), torch.optim.AdamW,
                         stage=1).load_state_dict(saved)
    except ValueError as error:
        refused = str(error)
    return {"uninterrupted": uninterrupted, "resumed": third(fresh, reopened),
            "lr": reopened.param_groups[0]["lr"], "refused": refused,
            "state_tensors": len(saved["inner"]["state"])}


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request):
    return run(_scenarios, request.param)


@pytest.mark.parametrize("name", SCENARIOS)
def test_equal_to_one_process_and_to_zero_redundancy_optimizer(ranks, name):
    dtype = SCENARIOS[name][3]
    # fp32: only the order of the ranks' sums differs (a few ulps); bf16: one rounding of the
    # averaged gradient (bf16 has 8 bits of mantissa) may differ from the one-process gradient
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    row = ranks[0][name]
    for stage in (1, 2):
        torch.testing.assert_close(row[stage], row["plain"], **tol)
        torch.testing.assert_close(row[stage], row["torch"], **tol)
        for r in ranks:                        # every rank holds every updated shard
            torch.testing.assert_close(r[name][stage], row[stage], rtol=0, atol=0)
        assert all(t.dtype == dtype for t in row[stage].values())
        for skipped in ("frozen.weight", "frozen.bias", "unused.weight", "unused.bias"):
            torch.testing.assert_close(row[stage][skipped], row["initial"][skipped], rtol=0, atol=0)
        assert row[stage]["inp.weight"].ne(row["initial"]["inp.weight"]).any()


def test_param_groups_keep_their_own_hyperparameters(ranks):
    assert ranks[0]["two groups"]["lr1"] == [3e-2, 1e-2]
    assert ranks[0]["adamw"]["lr2"] == [1e-2]


def test_state_dict_round_trip_resumes_exactly_and_refuses_another_layout(ranks):
    for r in ranks:
        resume = r["resume"]
        torch.testing.assert_close(resume["resumed"], resume["uninterrupted"], rtol=0, atol=0)
        assert resume["lr"] == 1e-2            # the saved hyperparameters, not the constructor's
        assert resume["state_tensors"] == 4    # one piece per parameter that got a gradient
        assert "stage" in resume["refused"] and "each rank loads the shard it saved" in resume["refused"]


def test_an_lr_schedule_on_its_param_groups_reaches_the_shards(ranks):
    scheduled = ranks[0]["scheduled"]
    torch.testing.assert_close(scheduled["sharded"], scheduled["plain"])


def test_bad_arguments_are_refused_before_any_collective():
    with pytest.raises(ValueError, match="stage must be 1"):
        ShardedOptimizer(Net().parameters(), torch.optim.SGD, stage=3, lr=0.1)
    with pytest.raises(TypeError, match="not an instance"):
        ShardedOptimizer(Net().parameters(), torch.optim.SGD(Net().parameters(), lr=0.1))
