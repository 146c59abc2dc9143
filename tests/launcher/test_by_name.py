"""A rank function named by module and name: the caller never imports its module (issue 50)."""
from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from course_lib.launcher import _warm
from course_lib.launcher.by_name import ByName
from course_lib.launcher.launch import run

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def test_a_named_function_runs_in_the_ranks_and_its_module_is_preimported():
    fn = ByName("torch.distributed", "get_rank")
    assert run(fn, 2) == [0, 1]
    assert "torch.distributed" in _warm.preimports_of(fn)
    assert len(pickle.dumps(fn)) < 200  # two names, not the function


def _in_a_fresh_interpreter(code: str) -> list:
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code + "\nprint(sorted(m for m in "
                          "('torch.distributed.fsdp', 'torch.distributed.tensor', 'sympy', "
                          "'torch._dynamo') if m in sys.modules))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_the_capstones_notebook_side_leaves_fsdp_dtensor_and_dynamo_to_the_ranks():
    """Chapter 12's kernel imported the training loop (FSDP2, DTensor, DCP, sympy) to hand
    ``rank_entry`` over, and torch._dynamo for the FLOP counter: ~0.1 GiB of a 1 GB pod."""
    code = ("from course_lib.capstone.measure import predict_run\n"
            "import course_lib.capstone.show, course_lib.fault_tolerance.faults\n"
            "assert predict_run({'dp_shard': 2, 'tp': 2}, 'tiny').flops_per_step > 0")
    assert _in_a_fresh_interpreter(code) == "[]"


def test_chapter_09s_notebook_side_leaves_fsdp_and_dtensor_to_the_ranks():
    """Chapter 09's kernel imported FSDP2, DTensor and sympy (~0.04 GiB) through
    ``run_parallel``'s module, whose rank functions need them."""
    code = ("import course_lib.composition.measure, course_lib.composition.show\n"
            "import course_lib.pipeline_parallel.torch_schedules, course_lib.composition.mesh")
    assert _in_a_fresh_interpreter(code) == "[]"
