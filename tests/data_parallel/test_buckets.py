"""Chapter 2: DDP by hand with buckets and overlap == torch DDP; the bucket exercise's check."""
from __future__ import annotations

import pytest
import torch

from course_lib import check_true
from course_lib.common.models import GPT, get_config
from course_lib.data_parallel.buckets import DEFAULT_CAP_BYTES, compare_overlapped, make_buckets
from course_lib.data_parallel.by_hand import TOLERANCE
from course_lib.data_parallel.exercises import check_make_buckets


def _tiny_params():
    with torch.device("meta"):
        return list(GPT(get_config("tiny")).parameters())


@pytest.mark.parametrize("world", [2, 4])
def test_hand_buckets_equal_torch_ddp_and_one_process_and_launch_during_backward(world):
    result = compare_overlapped(world=world)
    assert max(result.hand_vs_single, result.torch_vs_single, result.hand_vs_torch) \
        <= TOLERANCE["atol"]
    assert result.ranks_spread == 0.0
    assert result.buckets == result.ddp_buckets           # DDP rebuilt exactly these buckets
    assert len(result.buckets) == 3
    launched_after = [produced for _, produced in result.launches]
    assert [b for b, _ in result.launches] == [0, 1, 2]   # last layers' bucket first
    assert launched_after[-1] == result.n_grads == 29     # the last one when backward is done
    assert launched_after[0] < result.n_grads // 2        # the first one early: overlap


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
    with pytest.raises(ValueError, match="cap_bytes"):
        compare_overlapped(cap_bytes=0)
