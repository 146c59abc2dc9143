"""Chapter 12's cluster exercises: the sbatch and TrainJob templates, filled, pass only as the
files course_lib.capstone.cluster writes; each wrong value gets its own directional message."""
from __future__ import annotations

import pytest

from course_lib.capstone.cluster import script_args, slurm_script, trainjob_manifest
from course_lib.capstone.exercises import check_sbatch, check_trainjob
from course_lib.capstone.jobfiles import (fill, sbatch_template,
                                          trainjob_template)

ARGS = script_args({"dp_shard": 8, "tp": 8}, preset="small", steps=1000)
SBATCH = {"nodes": 8, "tasks_per_node": 1, "gpus_per_node": 8, "nproc_per_node": 8,
          "rdzv_endpoint": "$HEAD_NODE_ADDR:29500"}
K8S = {"nodes": 8, "gpus_per_node": 8, "nproc_per_node": 8,
       "rdzv_endpoint": "${PET_MASTER_ADDR}:${PET_MASTER_PORT}"}


def test_the_templates_hold_every_gap_and_give_no_value_away():
    s, k = sbatch_template(ARGS), trainjob_template(ARGS)
    for gap in SBATCH:
        assert f"<{gap}>" in s
    for gap in K8S:
        assert f"<{gap}>" in k
    assert "$HEAD_NODE_ADDR:29500" not in s and "one torchrun agent per node" not in s
    assert "PET_MASTER_PORT" not in k


def test_the_filled_templates_pass_and_are_the_generated_files_but_for_two_comments():
    sbatch = fill(sbatch_template(ARGS), **SBATCH)
    assert check_sbatch(sbatch, 8, 8, ARGS).passed
    assert check_trainjob(fill(trainjob_template(ARGS), **K8S), 8, 8, ARGS).passed
    differ = [a for a, b in zip(sbatch.splitlines(), slurm_script(8, 8, ARGS).splitlines()) if a != b]
    assert len(differ) == 2 and len(sbatch.splitlines()) == len(slurm_script(8, 8, ARGS).splitlines())
    assert len(fill(trainjob_template(ARGS), **K8S).splitlines()) == len(trainjob_manifest(8, 8, ARGS).splitlines())


@pytest.mark.parametrize("change,words", [
    ({"tasks_per_node": 8}, "--ntasks-per-node=8 is too high"),
    ({"nodes": 4}, "--nodes=4 is too low"),
    ({"nproc_per_node": 64}, "--nproc-per-node=64 is too high"),
    ({"gpus_per_node": 4}, "--gpus-per-node=4 is too low"),
    ({"rdzv_endpoint": "localhost:29500"}, "its own address"),
    ({"rdzv_endpoint": "$SLURMD_NODENAME:29500"}, "not where this job's first node listens"),
    ({"rdzv_endpoint": "$HEAD_NODE_ADDR:29500 (wrong)"}, "differs elsewhere"),
    ({"nodes": ...}, "not answered yet"),
])
def test_each_wrong_sbatch_value_is_named_with_its_direction(change, words):
    got = check_sbatch(fill(sbatch_template(ARGS), **{**SBATCH, **change}), 8, 8, ARGS)
    assert not got.passed and words in got.message, got.message


@pytest.mark.parametrize("change,words", [
    ({"nodes": 64}, "numNodes=64 is too high"),
    ({"nproc_per_node": 1}, "--nproc-per-node=1 is too low"),
    ({"rdzv_endpoint": "127.0.0.1:29500"}, "its own address"),
    ({"gpus_per_node": "eight"}, "not a whole number"),
])
def test_each_wrong_trainjob_value_is_named_with_its_direction(change, words):
    got = check_trainjob(fill(trainjob_template(ARGS), **{**K8S, **change}), 8, 8, ARGS)
    assert not got.passed and words in got.message, got.message


def test_a_gap_the_template_lacks_is_refused():
    with pytest.raises(ValueError, match="no gap"):
        fill(trainjob_template(ARGS), tasks_per_node=1)
