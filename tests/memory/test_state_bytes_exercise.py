"""Chapter 1's code exercise: state_bytes(model, optimizer) against the tracker, on real ranks.

The solution passes; the plausible mistakes of the notebook's ``exercise_wrong`` fail, each with
feedback that names the problem and not the expected number of bytes.
"""
import re

import pytest
import torch

from course_lib.common.models import GPT, get_config
from course_lib.memory.exercises import _verdict, check_state_bytes
from course_lib.memory.tracker import measure_step


def solution(model, optimizer):
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                if p.grad is not None)
    states = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                 for t in s.values() if torch.is_tensor(t))
    return {"params": params, "grads": grads, "optimizer": states}


def one_moment(model, optimizer):
    out = solution(model, optimizer)
    out["optimizer"] = sum(s["exp_avg"].numel() * s["exp_avg"].element_size()
                           for s in optimizer.state.values())
    return out


def no_step_counters(model, optimizer):
    out = solution(model, optimizer)
    out["optimizer"] = 2 * out["params"]
    return out


def numel_not_bytes(model, optimizer):
    return {"params": sum(p.numel() for p in model.parameters()),
            "grads": sum(p.grad.numel() for p in model.parameters()),
            "optimizer": sum(t.numel() for s in optimizer.state.values() for t in s.values())}


def state_dict_twice(model, optimizer):
    out = solution(model, optimizer)
    out["params"] = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return out


def test_the_solution_passes_on_both_setups():
    passed, message = check_state_bytes(solution)
    assert passed, message
    assert "fp32 Adam and mixed precision" in message


@pytest.mark.parametrize("fn,expected", [
    (one_moment, r"rank 0 \(fp32 Adam\): optimizer: 0\.50× .* how many moments"),
    (no_step_counters, r"rank 0 .*optimizer: short by exactly 4 bytes per parameter \*tensor\*"),
    (numel_not_bytes, r"params, grads, optimizer: counted in elements, not bytes"),
    (state_dict_twice, r"rank 1 \(mixed precision, tied embeddings\): params: 1\.\d\d× .*counted twice"),
    (lambda model, optimizer: None, r"returned a NoneType; return a dict"),
    (lambda model, optimizer: {"params": 1}, r"no key 'grads'"),
])
def test_plausible_mistakes_fail_with_feedback_that_does_not_give_the_bytes(fn, expected):
    passed, message = check_state_bytes(fn)
    assert not passed
    assert re.search(expected, message), message
    truth = measure_step(_rank0_model(), _rank0_batch())  # the same setup as rank 0, measured again
    for key in ("params", "grads", "optimizer"):
        assert str(truth[key]) not in message.replace(",", "")


def _rank0_model():
    torch.manual_seed(0)
    return GPT(get_config("tiny").replace(n_layer=1))


def _rank0_batch():
    tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()


def test_a_stub_raises_on_the_rank_and_bad_arguments_fail_before_any_process():
    def stub(model, optimizer):
        raise NotImplementedError("your code")
    from course_lib.launcher.launch import RankError
    with pytest.raises(RankError, match="NotImplementedError"):
        check_state_bytes(stub)
    with pytest.raises(TypeError, match="no parentheses"):
        check_state_bytes(solution(GPT(get_config("tiny")), torch.optim.SGD([torch.ones(1)])))
    with pytest.raises(ValueError, match="world must be 1 or 2"):
        check_state_bytes(solution, world=3)


def test_verdicts_name_the_pattern_without_the_number():
    facts = {"tensors": 10, "elements": {"params": 1000, "grads": 1000, "optimizer": 2010}}
    assert _verdict("params", 4000, 4000, facts) is None
    assert _verdict("params", 1000, 4000, facts).startswith("counted in elements")
    assert _verdict("optimizer", 8000, 8040, facts).startswith("short by exactly 4 bytes")
    assert "how many moments" in _verdict("optimizer", 4000, 8040, facts)
    assert _verdict("grads", "list", 4000, facts) == "a list, expected a number of bytes"
    assert _verdict("grads", float("nan"), 4000, facts) == "NaN"
    for key, mine in (("params", 5000), ("optimizer", 9000)):
        assert "4000" not in _verdict(key, mine, 4000, facts) and "8040" not in _verdict(key, mine, 8040, facts)
