"""The same script on a cluster: a Slurm ``sbatch`` script and a Kubeflow Trainer ``TrainJob``
that run ``course_lib/capstone/train_gpt.py`` unchanged, one torchrun agent per node, meeting at
a c10d rendezvous on the first node.

Both embed :func:`course_lib.cluster_command`'s line (with its comment: the rendezvous store
has no authentication and holds a pickle every agent loads, so only the job's nodes may reach
its port). Kubeflow Trainer v2's ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``, runtime
``torch-distributed``) replaces Training Operator v1's ``PyTorchJob``; its runtime gives each
node ``PET_MASTER_ADDR`` / ``PET_MASTER_PORT``, the first node's address. Nothing here is run on
a cluster by the course: the files are checked to parse, and their torchrun arguments are run
on this machine as 2 loopback "nodes" (chapter 05's harness).
"""
from __future__ import annotations

import json
import shlex

from course_lib.common.checks import positive_int
from course_lib.composition.layout import Layout
from course_lib.launcher.torchrun import cluster_command

__all__ = ["SCRIPT", "GPU_NOTE", "script_args", "slurm_script", "trainjob_manifest"]

SCRIPT = "course_lib/capstone/train_gpt.py"  # relative to the repository, on every node
GPU_NOTE = ("# train_gpt.py --device auto (its default): each rank trains on GPU $LOCAL_RANK and "
            "joins with NCCL;\n# on a node where torch sees no GPU it falls back to CPU + gloo")


def script_args(layout: Layout | dict, preset: str = "small", steps: int = 1000,
                ckpt_dir: str = "/shared/ckpt/train_gpt", every: int = 100) -> list[str]:
    """The script's arguments for ``layout`` (its sizes multiply to nodes × GPUs per node)."""
    text = ",".join(f"{k}={v}" for k, v in Layout.parse(layout, ranks=None).sizes().items())
    return ["--layout", text, "--preset", preset, "--steps", str(steps), "--every", str(every),
            "--ckpt-dir", ckpt_dir]


def _line(nnodes: int, gpus: int, args: list[str], head: str) -> str:
    positive_int(nnodes, "nnodes")
    positive_int(gpus, "gpus_per_node")
    return cluster_command(SCRIPT, gpus, nnodes, [shlex.quote(a) for a in args], head=head)


def slurm_script(nnodes: int, gpus_per_node: int, args: list[str], *,
                 job_name: str = "train-gpt", port: int = 29500) -> str:
    """An ``sbatch`` script: one task per node, each running one torchrun agent."""
    line = _line(nnodes, gpus_per_node, args, f"$HEAD_NODE_ADDR:{port}")
    comment, command = line.rsplit("\n", 1)
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1          # one torchrun agent per node",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        "#SBATCH --exclusive",
        "set -euo pipefail",
        'HEAD_NODE_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "JOB_ID=$SLURM_JOB_ID                  # the rendezvous id: the same on every node",
        "export HEAD_NODE_ADDR JOB_ID",
        GPU_NOTE,
        comment,
        f"srun bash -c {shlex.quote(command)}",
        ""])


def trainjob_manifest(nnodes: int, gpus_per_node: int, args: list[str], *,
                      image: str = "ghcr.io/your-org/course:latest",
                      job_name: str = "train-gpt") -> str:
    """A Kubeflow Trainer ``TrainJob`` (YAML; JSON strings are valid YAML scalars)."""
    line = _line(nnodes, gpus_per_node, args, "${PET_MASTER_ADDR}:${PET_MASTER_PORT}")
    comment, command = line.rsplit("\n", 1)
    q = json.dumps
    return "\n".join([
        comment,
        GPU_NOTE,
        "apiVersion: trainer.kubeflow.org/v1alpha1",
        "kind: TrainJob",
        "metadata:",
        f"  name: {job_name}",
        "spec:",
        "  runtimeRef:",
        "    name: torch-distributed",
        "  trainer:",
        f"    image: {q(image)}",
        f"    numNodes: {nnodes}",
        "    env:",
        "      - name: JOB_ID                 # the rendezvous id: the same on every node",
        f"        value: {q(job_name)}",
        f"    command: [\"bash\", \"-c\", {q(command)}]",
        "    resourcesPerNode:",
        "      limits:",
        f"        nvidia.com/gpu: {gpus_per_node}",
        ""])
