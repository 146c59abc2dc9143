"""Chapter 12: the same script on a cluster. The generated sbatch script and TrainJob parse and
name the same script, layout and c10d rendezvous; their torchrun arguments run on this machine
as 2 loopback "nodes" × 2 ranks (chapter 05's harness)."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from course_lib.capstone.cluster import SCRIPT, script_args, slurm_script, trainjob_manifest
from course_lib.communication.multinode import run_two_nodes

ROOT = Path(__file__).resolve().parents[2]


def _torchrun_argv(command: str) -> list[str]:
    argv = shlex.split(command)
    return argv[argv.index("torchrun"):]


def _slurm_command(text: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith("srun "))
    return shlex.split(line)[-1]  # srun bash -c '<torchrun ...>'


def test_the_generated_files_parse_and_name_the_same_job(tmp_path):
    yaml = pytest.importorskip("yaml")
    args = script_args({"dp_shard": 8, "tp": 2}, preset="small", steps=1000)
    sbatch = slurm_script(2, 8, args)
    (tmp_path / "job.sh").write_text(sbatch)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True)
    manifest = yaml.safe_load(trainjob_manifest(2, 8, args))
    assert manifest["kind"] == "TrainJob" and manifest["spec"]["trainer"]["numNodes"] == 2
    assert manifest["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert "no authentication" in sbatch and "no authentication" in trainjob_manifest(2, 8, args)
    assert "NCCL" in sbatch and "NCCL" in trainjob_manifest(2, 8, args)
    k8s = _torchrun_argv(manifest["spec"]["trainer"]["command"][2])
    slurm = _torchrun_argv(_slurm_command(sbatch))
    for argv in (k8s, slurm):
        assert {"--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
                "--rdzv-id=$JOB_ID"} <= set(argv)
        at = argv.index(SCRIPT)
        assert argv[at + 1:] == args and "dp_shard=8,tp=2" in argv
    assert "--rdzv-endpoint=$HEAD_NODE_ADDR:29500" in slurm
    assert "--rdzv-endpoint=${PET_MASTER_ADDR}:${PET_MASTER_PORT}" in k8s
    with pytest.raises(ValueError, match="nnodes must be a positive integer"):
        slurm_script(0, 8, args)


def test_the_generated_command_runs_as_two_loopback_nodes(tmp_path):
    args = script_args({"dp_shard": 2, "tp": 2}, preset="tiny", steps=3, ckpt_dir=str(tmp_path),
                       every=3)
    generated = _torchrun_argv(_slurm_command(slurm_script(2, 2, args)))
    at = generated.index(SCRIPT)
    assert generated[at + 1:] == args
    result = run_two_nodes(str(ROOT / SCRIPT), 2, generated[at + 1:], timeout=240)
    node0 = result.outputs[0]
    assert "attempt 0: layout {'dp_shard': 2, 'tp': 2}, started fresh" in node0
    assert "--nnodes=2" in result.commands[0] and "--rdzv-backend=c10d" in result.commands[0]
    assert (tmp_path / "step_000003" / "manifest.json").is_file()  # 4 ranks over 2 nodes saved
