"""The course's one byte counter (``CommCounter``) on 2 real ranks: every kind of collective it
records, with the message size computed here from the tensors, not by the counter's rule."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_lib.launcher.launch import run
from course_lib.sharding.comm_counter import CommCounter

N = 6   # elements per rank


def _each_collective() -> dict:
    """Run on each rank: one call of each kind under its own counter; what each recorded."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    world, group = dist.get_world_size(), dist.group.WORLD
    x = torch.arange(N, dtype=torch.float32)
    big = torch.empty(world * N)
    calls = {
        "c10d all_reduce": lambda: dist.all_reduce(x.clone()),
        "c10d all_gather": lambda: dist.all_gather_into_tensor(big, x),
        "c10d reduce_scatter": lambda: dist.reduce_scatter_tensor(torch.empty(N), big.clone()),
        "c10d broadcast": lambda: dist.broadcast(x.clone(), src=0),
        "functional all_reduce": lambda: funcol.all_reduce(x, "sum", group).wait(),
        "functional all_gather": lambda: funcol.all_gather_tensor(x, 0, group).wait(),
        "functional reduce_scatter": lambda: funcol.reduce_scatter_tensor(big, "sum", 0, group).wait(),
        "functional all_to_all, autograd": lambda: funcol.all_to_all_single_autograd(
            big.clone().requires_grad_(), None, None, group).wait(),
        "DTensor Partial -> Replicate": lambda: DTensor.from_local(
            x.clone(), init_device_mesh("cpu", (world,)), [Partial()]).redistribute(
            placements=[Replicate()]).to_local(),
        "bf16 all_reduce": lambda: dist.all_reduce(x.to(torch.bfloat16)),
    }
    out = {}
    for name, call in calls.items():
        with CommCounter() as counter:
            call()
        out[name] = list(counter.calls)
    return out


@pytest.fixture(scope="module")
def recorded():
    return run(_each_collective, 2, threads=1)


def test_every_kind_recorded_once_with_the_whole_buffer(recorded):
    one, whole = N * 4, 2 * N * 4     # this rank's tensor; the world's (all-gather out, RS in)
    f32, bf16 = torch.float32, torch.bfloat16
    expected = {
        "c10d all_reduce": [("all_reduce", one, f32)],
        "c10d all_gather": [("all_gather", whole, f32)],
        "c10d reduce_scatter": [("reduce_scatter", whole, f32)],
        "c10d broadcast": [("broadcast", one, f32)],
        "functional all_reduce": [("all_reduce", one, f32)],
        "functional all_gather": [("all_gather", whole, f32)],
        "functional reduce_scatter": [("reduce_scatter", whole, f32)],
        "functional all_to_all, autograd": [("all_to_all", whole, f32)],
        "DTensor Partial -> Replicate": [("all_reduce", one, f32)],
        "bf16 all_reduce": [("all_reduce", N * 2, bf16)],
    }
    for rank, calls in enumerate(recorded):
        assert calls == expected, f"rank {rank}"


def test_summaries_and_the_zero_paper_volume():
    counter = CommCounter()
    counter.calls += [("all_reduce", 10, None), ("all_gather", 4, None), ("all_reduce", 1, None)]
    assert counter.bytes_by_type() == {"all_reduce": 11, "all_gather": 4}
    assert counter.calls_by_type() == {"all_reduce": 2, "all_gather": 1}
    assert counter.volume() == 2 * 11 + 4
    counter.reset()
    assert counter.calls == [] and counter.volume() == 0
