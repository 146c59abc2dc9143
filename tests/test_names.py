"""``check_*`` means an exercise grader (the exercise finder matches ``\\bcheck_\\w+\\(``); a function
that raises on bad input is ``validate_*``. The old public names stay as aliases (issue 32)."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "course_lib"
RENAMED = [
    ("pipeline_parallel.schedules", "check_pipeline", "validate_pipeline"),
    ("tensor_parallel.layers", "check_tp_degree", "validate_tp_degree"),
    ("composition.layouts", "check_layout", "validate_layout"),
    ("sharding.measure", "check_fits", "validate_fits"),
    ("sharding.rank_measure", "check_request", "validate_request"),
    ("fault_tolerance.checkpoint_safe", "check_metadata", "validate_metadata"),
    ("fault_tolerance.safe_files", "check_record", "validate_record"),
    ("sharding.strategies", "train_rank", "train_rank_sharded"),
    ("data_parallel.measure", "train_rank", "train_rank_dp"),
]


def test_only_graders_are_named_check():
    found = [f"{p.relative_to(ROOT)}:{node.name}" for p in ROOT.rglob("*.py")
             if not p.name.startswith("exercises")
             for node in ast.parse(p.read_text()).body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")]
    assert found == [], "a function that raises on bad input is validate_*, not check_*"


@pytest.mark.parametrize("module,old,new", RENAMED)
def test_the_old_public_name_is_the_renamed_function(module, old, new):
    mod = importlib.import_module(f"course_lib.{module}")
    assert getattr(mod, old) is getattr(mod, new) and getattr(mod, new).__name__ == new
    assert {old, new} <= set(mod.__all__)


def test_the_two_training_loops_have_distinct_names():
    import course_lib
    from course_lib.data_parallel.measure import train_rank_dp
    assert course_lib.train_rank is course_lib.train_rank_sharded is not train_rank_dp
