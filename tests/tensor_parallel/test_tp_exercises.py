"""Chapter 4's f/g exercise and the notebook's TP-MLP comparison, on real ranks.

The check must pass Megatron's f and g, and fail each plausible mistake with a message that says
what is off (which rank, forward or backward, t× or 1/t) without giving the code away.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.tensor_parallel import exercises
from course_lib.tensor_parallel.exercises import check_f_and_g, compare_tp_mlp
from course_lib.tensor_parallel.layers import TPMLP


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class AllReduceForward(torch.autograd.Function):   # f's communication in the wrong pass
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class AllReduceBoth(torch.autograd.Function):      # g that also all-reduces in backward
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad, None


def f(x, group=None):
    return CopyToTP.apply(x, group)


def g(x, group=None):
    return ReduceFromTP.apply(x, group)


def identity(x, group=None):
    return x


def f_forward(x, group=None):
    return AllReduceForward.apply(x, group)


def g_twice(x, group=None):
    return AllReduceBoth.apply(x, group)


def g_mean(x, group=None):
    return ReduceFromTP.apply(x, group) / dist.get_world_size()


def nothing(x, group=None):
    return None


def test_megatron_f_and_g_pass_on_two_and_four_ranks():
    for t in (2, 4):
        passed, message = check_f_and_g(f, g, t=t)
        assert passed, message
        assert f"{t} real ranks" in message


@pytest.mark.parametrize("mine_f,mine_g,words", [
    (f_forward, g, "f's output on rank 0 differs from its input (2× its input)"),
    (identity, identity, "holds only its own partial output"),
    (f, identity, "holds only its own partial output"),
    (f, g_mean, "1/2 of the dense one: averaged rather than added"),
    (identity, g, "x.grad on rank 0 holds only the gradient through its own slice"),
    (f, g_twice, "the gradient of the input x is 2× the dense one"),
    (nothing, g, "f returned NoneType, not a tensor"),
], ids=["allreduce-in-f-forward", "no-allreduce", "no-g", "averaged", "no-f", "g-backward-too",
        "returns-none"])
def test_each_mistake_fails_and_says_what_is_off(mine_f, mine_g, words):
    passed, message = check_f_and_g(mine_f, mine_g)
    assert not passed
    assert words in message, message


def test_the_notebook_mlp_equals_dense_and_dtensor():
    for t in (2, 4):
        for verdicts in compare_tp_mlp(TPMLP, t):
            assert verdicts == {"output": True, "input_grad": True, "weight_grads": True,
                                "dtensor": True}


class NoReduceMLP(TPMLP):
    """The split without g: each rank keeps its partial sum (and adds the bias to it)."""

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x))) + self.proj_bias


def test_the_mlp_comparison_catches_a_missing_all_reduce():
    for verdicts in compare_tp_mlp(NoReduceMLP, 2):
        assert verdicts["output"] is False and verdicts["dtensor"] is False


def test_bad_input_fails_before_any_process(monkeypatch):
    monkeypatch.setattr(exercises, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(TypeError, match="pass your function f itself"):
        check_f_and_g(3, g)
    with pytest.raises(ValueError, match="t must be 2 or 4"):
        check_f_and_g(f, g, t=3)
    with pytest.raises(TypeError, match="pass the class itself"):
        compare_tp_mlp("TPMLP")
    with pytest.raises(ValueError, match="t must be 1, 2 or 4"):
        compare_tp_mlp(TPMLP, 3)
