"""One meaning per name. ``check_*`` means an exercise grader (the exercise finder matches
``\\bcheck_\\w+\\(``); a function that raises on bad input is ``validate_*`` (issue 32). Issue 51
renamed the names that meant two things; every old public name still works for one release, warns
with its new name, and is out of ``__all__``. The public API list is what the notebooks use."""
from __future__ import annotations

import ast
import importlib
import json
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "course_lib"
NOTEBOOKS = sorted((ROOT.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# module, old name, new name (a dotted new name: the thing moved house)
DEPRECATED = [
    ("pipeline_parallel.schedules", "check_pipeline", "validate_pipeline"),
    ("tensor_parallel.layers", "check_tp_degree", "validate_tp_degree"),
    ("sharding.measure", "check_fits", "validate_fits"),
    ("sharding.rank_measure", "check_request", "validate_request"),
    ("fault_tolerance.checkpoint_safe", "check_metadata", "validate_metadata"),
    ("fault_tolerance.metadata_check", "check_metadata", "validate_metadata"),
    ("fault_tolerance.safe_files", "check_record", "validate_record"),
    ("launcher._diagnose", "check_debug", "validate_debug"),
    ("launcher.devices", "check_timeout", "validate_timeout"),
    ("launcher.devices", "plan", "place"),
    ("sharding.strategies", "train_rank", "train_rank_sharded"),
    ("data_parallel.measure", "train_rank", "train_rank_dp"),
    ("capstone.train", "train_rank", "train_rank_capstone"),
    ("capstone.train", "DEVICE_CHOICES", "course_lib.launcher.devices.DEVICE_CHOICES"),
    ("finetuning.planner", "plan", "plan_finetuning"),
    ("finetuning.memory", "measure_finetune", "course_lib.finetuning.footprint.measure_finetune"),
    ("deepspeed.census", "census", "course_lib.deepspeed.holdings.holdings"),
    ("deepspeed.census", "split_key_bias", "course_lib.deepspeed.holdings.split_key_bias"),
    ("composition.layouts", "check_layout", "validate_layout"),
    *[(m, f"DDP_{n}BUCKET_BYTES", f"course_lib.data_parallel.buckets.DDP_{n}BUCKET_BYTES")
      for m in ("composition.predict", "capstone.predict") for n in ("", "FIRST_")],
    *[("capstone.predict", n, f"course_lib.composition.predict.{n}") for n in (
        "predict_rank", "rank_prediction", "rank_work", "step_time", "slowest", "slowest_step",
        "predict_peak", "root_bytes", "comm_per_step", "collective_seconds", "predict_step_time",
        "ddp_buckets")],
    ("", "train_rank", "train_rank_sharded"),
    ("", "wrap", "course_lib.sharding.strategies.wrap"),
]


def _resolve(module: str, new: str):
    home, _, attr = new.rpartition(".") if "." in new else (module, "", new)
    return getattr(importlib.import_module(home), attr)


def test_only_graders_are_named_check():
    found = [f"{p.relative_to(ROOT)}:{node.name}" for p in ROOT.rglob("*.py")
             if not p.name.startswith("exercises")
             for node in ast.parse(p.read_text()).body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")]
    assert found == [], "a function that raises on bad input is validate_*, not check_*"


@pytest.mark.parametrize("module,old,new", DEPRECATED)
def test_an_old_name_still_works_warns_with_its_new_name_and_is_out_of_all(module, old, new):
    full = f"course_lib.{module}".rstrip(".")
    mod = importlib.import_module(full)
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(full)}\.{old} is deprecated: use "
                                                rf".*{re.escape(new)}"):
        got = getattr(mod, old)
    assert got is _resolve(full, new if "." in new else f"{full}.{new}")
    assert old not in getattr(mod, "__all__", ())


def test_the_training_loops_have_one_name_each():
    from course_lib.capstone.train import train_rank_capstone
    from course_lib.data_parallel.measure import train_rank_dp
    from course_lib.sharding.strategies import train_rank_sharded
    loops = [train_rank_sharded, train_rank_dp, train_rank_capstone]
    assert len(set(loops)) == 3 and all(f.__name__ != "train_rank" for f in loops)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import course_lib
        assert course_lib.train_rank is train_rank_sharded


def _notebook_imports() -> tuple[set[str], set[str]]:
    """Names notebooks take from ``course_lib`` itself, and names they take from its modules or
    type in a cell (the library keeps the tested copy of an algorithm a chapter types)."""
    top, deep = set(), set()
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            code = "\n".join(line for line in "".join(cell["source"]).splitlines()
                             if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.ImportFrom) and node.module == "course_lib":
                    top |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib."):
                    deep |= {a.name for a in node.names}
                elif isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "course_lib":
                    top.add(node.attr)
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    deep.add(node.name)
    return top, deep


# exported though no notebook imports it: what a listed function returns or raises, a grader,
# the rank side of torchrun scripts, and the names docs/ and the exercises point learners to
NOT_IN_NOTEBOOKS = {
    "AlphaBeta", "BubbleSweep", "CheckpointError", "CollectiveResult", "MemoryReport",
    "LinkSweepUnavailable", "TorchrunError", "OverBudget", "Feedback", "check_close",
    "init_distributed", "torchrun_command", "progress", "Span", "Timeline", "chrome_trace",
    "BudgetTracker", "CommCounter", "QuantLinear", "quantize_model", "fsdp_full_state_dict",
    "train_step", "fit_alpha_beta", "predict_step", "LINKS", "link_sweep", "megatron_status",
    "compare_megatron", "measure_tp_model", "first_divergence", "all_finite", "nonfinite_ranks",
    "step_times", "latest_checkpoint", "load_checkpoint", "save_checkpoint",
    # 04-06's numeric exercises check in the library (check_bubble_budget, check_busbw,
    # check_young_daly); 04's bubble sweep and 05's 2-core scaling runs left the page (issue 61:
    # their stored results did not show the lesson; benchmarks and tests still run them)
    "bubble_formula", "usable_cores", "busbw_factor", "young_daly_interval", "measure_bubble_sweep",
    "measure_scaling", "scaling_over_link",
    # chapter 08 types its config as JSON, 09 its layouts as scripts, 10 its straggler check by
    # hand: the library's config builder, layout record and check stay for scripts and tests
    "deepspeed_config", "Layout", "stragglers",
    # chapter 12 reads the prediction from train_gpt's report (issue 59); scripts and tests call it
    "predict_run",
}


def test_the_public_api_list_is_what_the_notebooks_use():
    import course_lib
    top, deep = _notebook_imports()
    assert top - {"scripts"} <= set(course_lib.__all__), "a notebook uses an unlisted name"
    unused = set(course_lib.__all__) - top - deep - NOT_IN_NOTEBOOKS
    assert unused == set(), "listed, but no notebook uses it: drop it (with a warning) or say why"
    assert NOT_IN_NOTEBOOKS <= set(course_lib.__all__)
    for name in course_lib.__all__:
        assert getattr(course_lib, name) is not None


def test_the_clean_exit_instruments_left_the_launcher_and_their_old_names_warn(monkeypatch):
    from course_lib.launcher import exit_codes
    for name in ("fsdp_step", "ddp_step"):
        with pytest.warns(DeprecationWarning, match=rf"{name} is deprecated: use {name} of "
                                                    "benchmarks/bench_clean_exit.py"):
            assert getattr(exit_codes, name).__module__ == "bench_clean_exit"

    def fake_run(fn, nprocs, *args, report, **kwargs):
        report.exit_statuses = [0] * nprocs
    monkeypatch.setattr(exit_codes, "run", fake_run)
    with pytest.warns(DeprecationWarning, match=r"exit_statuses is deprecated: use run\("):
        assert exit_codes.exit_statuses(print, 3) == [0, 0, 0]


def test_the_link_sweep_recorder_left_the_library_and_its_old_names_warn():
    from course_lib.communication import link_sweep_record
    for name in ("record", "main"):
        with pytest.warns(DeprecationWarning, match=rf"{name} is deprecated: use {name} of "
                                                    "benchmarks/record_link_sweep.py"):
            assert getattr(link_sweep_record, name).__name__ == name
