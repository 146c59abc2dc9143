"""Chapter 2: DDPByHand == torch DDP on real ranks (tied, frozen, AdamW, no_sync, bf16, 2 and 4
ranks); launches during backward; the unused-parameter error; the exercises' checks."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_lib import DDPByHand, check_true
from course_lib.common.models import GPT, get_config
from course_lib.data_parallel.buckets import make_buckets
from course_lib.data_parallel.by_hand import broadcast_parameters
from course_lib.data_parallel.exercises import check_make_buckets
from course_lib.data_parallel.exercises_ddp import check_ddp_class
from course_lib.data_parallel.measure import TOLERANCE
from course_lib.data_parallel.measure_buckets import (DEFAULT_CAP_BYTES, SCENARIOS,
                                                      compare_by_hand)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def result(request):
    return compare_by_hand(world=request.param)   # every scenario, one launch per world size


def test_every_scenario_equals_torch_ddp_and_the_ranks_agree(result):
    assert result.equal == {name: True for name in SCENARIOS}, result.vs_torch
    if result.world == 2:                 # a + b in either order: bit-identical to DDP
        assert set(result.vs_torch.values()) == {0.0}
    assert result.ranks_spread == 0.0
    assert max(result.hand_vs_single, result.torch_vs_single) <= TOLERANCE["atol"]


def test_one_launch_per_bucket_per_step_none_under_no_sync(result):
    n_buckets = len(result.buckets)
    for name, per_step in result.per_step.items():
        expected = {"one bucket per tensor": result.n_grads,   # 29 tensors
                    "bf16 parameters": 2}.get(name, n_buckets)  # half the bytes: 2 buckets
        assert per_step == [expected] * result.steps, name


def test_buckets_launch_during_backward_in_the_parameters_dtype(result):
    assert [b for b, _ in result.launches] == [0, 1, 2]     # last layers' bucket first
    produced = [n for _, n in result.launches]
    assert produced[-1] == result.n_grads == 29             # the last one when backward is done
    assert produced[0] < result.n_grads // 2                # the first one early: overlap
    assert result.dtypes["bf16 parameters"] == (["bfloat16"], ["bfloat16"])
    assert result.dtypes["plain"] == (["float32"], ["float32"])


def test_a_parameter_without_gradient_is_an_error_naming_it(result):
    assert result.unused_error is not None
    assert "unused.weight" in result.unused_error and "unused.bias" in result.unused_error
    assert "requires_grad_(False)" in result.unused_error


def test_bad_arguments_fail_before_any_process_starts():
    with pytest.raises(ValueError, match="cap_bytes"):
        compare_by_hand(cap_bytes=0)
    with pytest.raises(ValueError, match="scenarios must be among"):
        compare_by_hand(scenarios=("bf17 parameters",))
    with pytest.raises(TypeError, match="the class itself"):
        compare_by_hand(object())
    with pytest.raises(ValueError, match="bucket_cap_mb must be > 0 or None"):
        DDPByHand(nn.Linear(1, 1), bucket_cap_mb=0)


# --- the build-it exercise: the learner's class, with the mistakes the notebook lists ---------

class PerTensorDDP(nn.Module):
    def __init__(self, module, frozen_too=False):
        super().__init__()
        self.module, self.require_sync, self.handles = module, True, []
        broadcast_parameters(module)
        for p in module.parameters():
            if p.requires_grad or frozen_too:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True

    def _grad_ready(self, param):
        if self.require_sync:
            self.handles.append((param, dist.all_reduce(param.grad, async_op=True)))

    def finish_gradient_synchronization(self):
        for param, work in self.handles:
            work.wait()
            param.grad /= dist.get_world_size()
        self.handles = []


class Summed(PerTensorDDP):
    def finish_gradient_synchronization(self):
        for _, work in self.handles:
            work.wait()
        self.handles = []


class NoWait(PerTensorDDP):
    def finish_gradient_synchronization(self):
        for param, _ in self.handles:
            param.grad /= dist.get_world_size()
        self.handles = []


class FrozenHooked(PerTensorDDP):
    def __init__(self, module):
        super().__init__(module, frozen_too=True)


class FiresUnderNoSync(PerTensorDDP):
    def _grad_ready(self, param):
        self.handles.append((param, dist.all_reduce(param.grad, async_op=True)))


class Blocking(PerTensorDDP):
    def _grad_ready(self, param):
        if self.require_sync:
            dist.all_reduce(param.grad)
            self.handles.append((param, None))

    def finish_gradient_synchronization(self):
        for param, _ in self.handles:
            param.grad /= dist.get_world_size()
        self.handles = []


def test_the_build_it_check_passes_the_solution_and_the_library_class():
    for cls in (PerTensorDDP, DDPByHand):
        feedback = check_true(lambda: check_ddp_class(cls))
        assert feedback.passed, (cls.__name__, feedback.message)


@pytest.mark.parametrize("cls,message", [
    (Summed, "you summed"),
    (NoWait, "wait() on every handle"),
    (FrozenHooked, "hook only the parameters that require a gradient"),
    (FiresUnderNoSync, "under no_sync()"),
    (Blocking, "nothing overlaps"),
])
def test_the_build_it_check_fails_each_mistake_with_a_pointer(cls, message):
    feedback = check_true(lambda: check_ddp_class(cls))
    assert not feedback.passed and message in feedback.message, feedback.message


# --- the bucket exercise -----------------------------------------------------------------------

def _tiny_params():
    with torch.device("meta"):
        return list(GPT(get_config("tiny")).parameters())


def test_make_buckets_follows_ddps_rule():
    params = _tiny_params()
    buckets = make_buckets(params, DEFAULT_CAP_BYTES)
    assert [p for b in buckets for p in b] == params[::-1]          # every param once, last first
    sizes = [sum(p.numel() * 4 for p in b) for b in buckets]
    assert all(s >= DEFAULT_CAP_BYTES for s in sizes[:-1]) and sizes[-1] < DEFAULT_CAP_BYTES
    assert all(s - b[-1].numel() * 4 < DEFAULT_CAP_BYTES for s, b in zip(sizes, buckets))


def forward_order(params, cap_bytes):
    return make_buckets(params[::-1], cap_bytes)


def never_flushed(params, cap_bytes):
    return make_buckets(params, cap_bytes)[:-1]


def never_over_cap(params, cap_bytes):
    buckets, current, size = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    return buckets + ([current] if current else [])


def twice(params, cap_bytes):
    return [list(params), [params[0]]]


def not_yet(params, cap_bytes):
    raise NotImplementedError


@pytest.mark.parametrize("fn,message", [
    (forward_order, "whose gradient backward produces last"),
    (never_flushed, "10 of 29 parameters are in no bucket"),
    (never_over_cap, "closes a bucket once it holds at least cap_bytes"),
    (twice, "a parameter is in two buckets"),
    (lambda params, cap_bytes: None, "return a list of buckets"),
    (lambda params, cap_bytes: [[p.clone() for p in params]], "not one of the parameters"),
    (not_yet, "not answered yet"),
])
def test_bucket_exercise_fails_each_mistake_with_a_pointer(fn, message):
    feedback = check_true(lambda: check_make_buckets(fn))
    assert not feedback.passed and message in feedback.message


def test_bucket_exercise_passes_the_solution_and_refuses_bad_arguments():
    feedback = check_true(lambda: check_make_buckets(make_buckets))
    assert feedback.passed and "the ones DDP builds itself" in feedback.message
    with pytest.raises(TypeError, match="no parentheses"):
        check_make_buckets(None)
    with pytest.raises(ValueError, match="world must be"):
        check_make_buckets(make_buckets, world=1)
