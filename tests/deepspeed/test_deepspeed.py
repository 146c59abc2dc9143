"""DeepSpeed ZeRO 0-3 on 2 CPU ranks vs torch DDP; its memory counted, predicted and estimated.

One launch (module fixture) runs every stage, the DDP reference and chapter 3's torch
measurements in the same two ranks: importing DeepSpeed costs seconds per process.
"""
from __future__ import annotations

import math
import sys

import pytest
import torch

from course_lib import zero
from course_lib.deepspeed.holdings import deepspeed_estimate, predict_deepspeed
from course_lib.deepspeed.exercises import check_fit_config, fit_answer
from course_lib.deepspeed.show import estimate_table, memory_rows
from course_lib.deepspeed.holdings import split_key_bias
from course_lib.deepspeed.engine import deepspeed_config, run_deepspeed, run_zero_stages
from course_lib.deepspeed.load import deepspeed_status
from course_lib.exercises import check_true
from course_lib.launcher.launch import run
from course_lib.common.models import GPTConfig, get_config, param_count

pytest.importorskip("deepspeed")

WORLD, STEPS, LR = 2, 3, 1e-3
# awkward sizes: Ψ = 1,854 is not a multiple of 2·N = 4 (flat-buffer padding) and 37 or 9
# rows do not split evenly in two (ZeRO-3 rounds each tensor up)
ODD = GPTConfig(n_layer=1, n_head=3, d_model=9, vocab_size=37, seq_len=9)


def _both(extensions: str) -> dict:
    import os

    from course_lib.deepspeed.engine import train_rank_deepspeed
    # a machine without a compiler and a cold extension cache, as on a fresh CI runner or Binder:
    # the course's path must never build DeepSpeed's CPU op
    os.environ["PATH"] = ""
    os.environ["TORCH_EXTENSIONS_DIR"] = extensions
    return {"tiny": train_rank_deepspeed(steps=STEPS),
            "odd": train_rank_deepspeed((1, 2, 3), ODD, steps=2, batch=(2, 9), torch_memory=False),
            "built": sorted(os.listdir(extensions)) if os.path.isdir(extensions) else []}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    assert deepspeed_status()[0], deepspeed_status()[1]
    extensions = str(tmp_path_factory.mktemp("torch_extensions"))
    return run(_both, WORLD, extensions, timeout=300)  # one launch for both models


def test_no_compiler_and_nothing_built(launched):
    assert all(r["built"] == [] for r in launched)


@pytest.fixture(scope="module")
def result(launched):
    return {"engine": "deepspeed", "reason": "", "ranks": [r["tiny"] for r in launched]}


def test_every_stage_matches_ddp_after_k_steps(result):
    for rank, mine in enumerate(result["ranks"]):
        ref_rest, ref_keys = split_key_bias(mine["ddp"]["params"])
        for stage in (0, 1, 2, 3):
            got = mine[stage]
            assert got["params"].keys() == mine["ddp"]["params"].keys()
            # losses: fp32 forward on identical weights and data; the gradients are summed in a
            # different order (DeepSpeed's flat buckets vs DDP's), ~1e-7 relative per step
            torch.testing.assert_close(got["losses"], mine["ddp"]["losses"], rtol=0, atol=1e-5)
            rest, keys = split_key_bias(got["params"])
            # Adam's update is g/sqrt(v) with |g| >> eps almost everywhere: summation-order
            # differences of ~1e-7 relative move 3 updates of lr=1e-3 by far less than 1e-5
            torch.testing.assert_close(rest, ref_rest, rtol=1e-5, atol=1e-5, msg=f"stage {stage}")
            # the key bias's gradient is exactly zero in exact arithmetic (softmax ignores a
            # constant added to a row of scores): what reaches Adam is rounding noise (~1e-10,
            # below eps), which Adam turns into updates of up to ~lr per step, different for
            # every summation order — bounded by steps·lr
            torch.testing.assert_close(keys, ref_keys, rtol=0, atol=STEPS * LR)


def test_script_under_torchrun_matches_the_run_ranks(result, tmp_path):
    """The practitioner's path: the JSON file and the script under the real torchrun launcher."""
    import ast
    import json
    import re
    from pathlib import Path

    from course_lib.launcher.torchrun import torchrun
    stage = 2
    config_file = tmp_path / "ds_config.json"
    config_file.write_text(json.dumps(deepspeed_config(stage)))  # the same dict the ranks used
    script = Path(__file__).resolve().parents[2] / "course_lib" / "deepspeed" / "train_deepspeed.py"
    # the script's defaults (tiny, --seq-len 32, --seed 0) and deepspeed_config's (micro-batch 4,
    # lr 1e-3) are the fixture's batch=(4, 32), seed and LR; raises TorchrunError if a rank fails
    out = torchrun(str(script), WORLD, ["--deepspeed_config", str(config_file), "--steps", STEPS],
                   quiet=True, timeout=180).output
    # rank 0's progress lines: the stage from the JSON, the world size from the launcher
    steps = re.findall(rf"^\[rank 0\] step (\d+) loss \S+ \(ZeRO stage {stage}, world {WORLD}\)$",
                       out, re.M)
    assert steps == [str(k) for k in range(STEPS)], out
    printed = {int(r): ast.literal_eval(v)
               for r, v in re.findall(r"^\[rank (\d+)\] losses: (\[.*\])$", out, re.M)}
    assert sorted(printed) == list(range(WORLD)), out  # both ranks reached the end
    for rank, losses in printed.items():
        # same code, data and seed in fresh processes: bit-identical here; a different torch
        # thread count per rank (torchrun vs run) may reorder sums, ~1e-7 relative per step,
        # so the stage-vs-DDP tolerance above applies
        torch.testing.assert_close(losses, result["ranks"][rank][stage]["losses"], rtol=0,
                                   atol=1e-5, msg=f"rank {rank}")


def test_measured_memory_equals_prediction_to_the_byte(result):
    shapes = zero.param_shapes("tiny")
    for rank, mine in enumerate(result["ranks"]):
        for stage in (0, 1, 2, 3):
            assert mine[stage]["after_backward"] == predict_deepspeed(
                shapes, stage, WORLD, rank=rank, moment="backward"), (rank, stage)
            assert mine[stage]["after_step"] == predict_deepspeed(shapes, stage, WORLD, rank=rank)


def test_padding_and_uneven_partitions_predicted(launched):
    shapes = zero.param_shapes(ODD)
    psi = param_count(ODD)
    assert psi % (2 * WORLD)  # the flat buffer really is padded
    for rank, mine in enumerate(r["odd"] for r in launched):
        for stage in (1, 2, 3):
            assert mine[stage]["after_backward"] == predict_deepspeed(
                shapes, stage, WORLD, rank=rank, moment="backward"), (rank, stage)
            assert mine[stage]["after_step"] == predict_deepspeed(shapes, stage, WORLD, rank=rank)
            torch.testing.assert_close(mine[stage]["losses"], mine["ddp"]["losses"], rtol=0,
                                       atol=1e-5)  # fp32, other summation order (see above)
        flat = math.ceil(psi / (2 * WORLD)) * 2 * WORLD
        assert mine[1]["after_step"]["params"] == 4 * flat  # padding included, counted once


def test_optimizer_and_master_bytes_from_the_partition_size(result):
    """Independent of predict_deepspeed: Adam's two fp32 moments over this rank's partition."""
    psi, shapes = param_count(get_config("tiny")), zero.param_shapes("tiny")
    flat = math.ceil(psi / (2 * WORLD)) * 2 * WORLD          # ZeRO-1/2 pad to 2·N elements
    stage3 = sum(math.ceil(math.prod(s) / WORLD) for s in shapes)  # ZeRO-3: per tensor
    for mine in result["ranks"]:
        assert mine[0]["after_step"]["optimizer"] == 2 * 4 * psi + 4 * len(shapes)
        for stage, part in ((1, flat // WORLD), (2, flat // WORLD), (3, stage3)):
            states = mine[stage]["after_step"]
            assert states["optimizer"] == 2 * 4 * part + 4  # one flat tensor, one step counter
            assert states["master"] == 4 * part             # fp32 master copy, even in fp32
        assert mine[3]["after_step"]["params"] == 4 * stage3


def test_torch_strategies_measured_in_the_same_ranks(result):
    shapes = zero.param_shapes("tiny")
    for rank, mine in enumerate(result["ranks"]):
        for name, stage in zero.STAGES.items():
            expected = zero.per_rank_bytes(shapes, name, WORLD)[rank]["model_states"]
            assert mine["torch"][stage]["model_states"] == expected, name


def test_course_prediction_closer_than_deepspeeds_estimators(result):
    config = get_config("tiny")
    psi = param_count(config)
    rows = memory_rows(result)
    assert [r["stage"] for r in rows] == [0, 1, 2, 3]
    for row in rows[1:]:
        assert abs(row["predicted"] - row["measured"]) < abs(row["ds_estimate"] - row["measured"])
    # DeepSpeed's own functions: 2Ψ + 18Ψ/N (stage 2), 4·largest layer + 18Ψ/N (stage 3)
    assert deepspeed_estimate(psi, 0, 2, WORLD) == 2 * psi + 18 * psi // WORLD
    assert deepspeed_estimate(psi, 1000, 3, WORLD) == 4 * 1000 + 18 * psi // WORLD
    assert "course" in estimate_table(rows)


def test_offload_estimates_are_deepspeeds_formulas():
    """Chapter 08's offload table: what each offload choice leaves on the GPU, by DeepSpeed's
    own estimator functions (stage_1_and_2.py / stage3.py estimate_zero*_model_states_mem_needs)."""
    psi, largest, n = 10**6, 1000, 8
    assert deepspeed_estimate(psi, largest, 2, n, "optimizer") == 2 * psi            # 16-bit weights only
    assert deepspeed_estimate(psi, largest, 3, n, "optimizer") == 4 * largest + 2 * psi // n
    assert deepspeed_estimate(psi, largest, 3, n, "optimizer+params") == 4 * largest
    assert deepspeed_estimate(psi, largest, 3, n) == 4 * largest + 18 * psi // n
    with pytest.raises(ValueError, match="only in ZeRO stage 3"):
        deepspeed_estimate(psi, largest, 2, n, "optimizer+params")
    with pytest.raises(ValueError, match="offload must be"):
        deepspeed_estimate(psi, largest, 2, n, "nvme")


def test_fallback_when_deepspeed_cannot_be_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # what `import deepspeed` sees when missing
    ok, reason = deepspeed_status()
    assert not ok and "DeepSpeed cannot be imported" in reason and "FSDP2" in reason
    with pytest.raises(RuntimeError, match="DeepSpeed cannot be imported"):
        run_deepspeed([2])  # before any process starts
    out = run_zero_stages(stages=[3], nprocs=WORLD, steps=2)  # torch's FSDP2 instead
    assert out["engine"] == "torch" and out["reason"] == reason
    shapes = zero.param_shapes("tiny")
    for rank, mine in enumerate(out["ranks"]):
        assert mine[3]["optimizer"] == "fsdp"
        torch.testing.assert_close(mine[3]["params"], mine["ddp"]["params"],
                                   rtol=1e-5, atol=1e-5)  # chapter 3's tolerance for FSDP vs DDP
        assert mine[3]["after_step"]["model_states"] == \
            zero.per_rank_bytes(shapes, "fsdp", WORLD)[rank]["model_states"]


def test_status_without_a_compiler_for_the_comm_op(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    ok, reason = deepspeed_status(build_comm_op=True)
    assert not ok and "no C++ compiler" in reason
    assert deepspeed_status()[0]  # the course's default does not build the op


def test_config_errors_and_shape():
    with pytest.raises(ValueError, match="ZeRO stage must be one of"):
        deepspeed_config(4)
    with pytest.raises(ValueError, match="micro_batch must be a positive integer"):
        deepspeed_config(1, micro_batch=0)
    with pytest.raises(ValueError, match="ZeRO stage must be one of"):
        run_deepspeed([5])
    config = deepspeed_config(3)
    assert config["zero_optimization"]["stage"] == 3
    assert config["optimizer"]["params"]["torch_adam"] is True
    assert config["gradient_clipping"] == 0.0


def test_fit_exercise_both_ways():
    shapes = zero.param_shapes("gpt-7b")
    wrong = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    too_much = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    solution = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    assert not check_true(lambda: check_fit_config(wrong, config=shapes))
    assert check_true(lambda: check_fit_config(solution, config=shapes))
    assert fit_answer("gpt-7b", 8, 80e9, shapes=shapes) == 1  # on 80 GB stage 1 fits ...
    passed, message = check_fit_config(too_much, config=shapes, gpu_bytes=80e9)
    assert not passed and "a lower stage" in message  # ... so stage 3 is not the answer there
    assert not check_true(lambda: check_fit_config(..., config=shapes))
    assert "train_micro_batch_size_per_gpu" in check_fit_config({"zero_optimization": {}},
                                                                config=shapes)[1]


def test_widget_function_shows_measured_and_predicted(result):
    from course_lib.deepspeed.show import deepspeed_widget, stage_breakdown
    text = stage_breakdown(result, 3, rank=1)
    measured = result["ranks"][1][3]["after_step"]["model_states"]
    assert f"{measured:,}" in text and "DeepSpeed's estimator" in text and "fsdp" in text
    widget = deepspeed_widget(result)  # answers N = 2 from the result, without a launch
    assert [c.value for c in widget.children[:2]] == [2, 2]


def test_holdings_figure_draws_the_census_of_the_run(result):
    import matplotlib
    matplotlib.use("Agg")
    from course_lib.deepspeed.show import plot_stage_holdings
    from test_figures_deepspeed import bar_totals
    for stage, totals in enumerate(bar_totals(plot_stage_holdings(result))):
        assert totals == pytest.approx([r[stage]["after_backward"]["model_states"] / 1e6
                                        for r in result["ranks"]])


def test_the_chapters_json_config_is_the_librarys():
    """Chapter 08 types its config as literal JSON; it is deepspeed_config's, stage by stage
    (the stage-3 threshold is in the text for every stage: stages 0-2 do not read it)."""
    import json
    import re
    from pathlib import Path
    nb = Path(__file__).resolve().parents[2] / "notebooks" / "08_deepspeed_and_megatron.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
    text = re.search(r'json\.loads\("""(.*?)"""\)', next(c for c in cells if "json.loads" in c), re.S)
    literal = json.loads(text.group(1))
    for stage in (2, 3):
        mine = {**literal, "zero_optimization": {**literal["zero_optimization"], "stage": stage}}
        want = deepspeed_config(stage)
        want["zero_optimization"].setdefault("stage3_param_persistence_threshold", 0)
        assert mine == want


def test_exercise_1_value_is_the_prediction_at_four_ranks():
    from course_lib.deepspeed.exercises import deepspeed_prediction
    from course_lib.common.models import get_config, param_count
    psi = param_count(get_config("tiny"))
    assert psi == 136_960  # the exercise cell states it
    assert deepspeed_prediction(stage=3, world=4) == pytest.approx(20 * psi // 4 + 4 * 2**14, rel=1e-3)
    assert deepspeed_prediction(stage=3, world=2) == 1_435_149  # the census at N = 2, stored above


def test_the_offload_cell_states_the_7b_gpts_numbers():
    from course_lib.common.models import get_config, param_count
    from course_lib.deepspeed.show import _largest
    config = get_config("gpt-7b")
    assert (param_count(config), _largest(config)) == (6_864_642_048, 50_304 * 4_096)
