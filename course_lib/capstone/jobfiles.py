"""The cluster files as templates the learner fills (chapter 12).

:func:`sbatch_template` and :func:`trainjob_template` are the files
:mod:`course_lib.capstone.cluster` writes, with the values that size and join the job left as
gaps ``<name>``; :func:`fill` puts the learner's values in; :func:`reference` is the file a
right answer gives (two comments that would give a gap away are worded as in the template).
:mod:`course_lib.capstone.exercises` checks a filled file.
"""
from __future__ import annotations

import re

from course_lib.capstone.cluster import slurm_script, trainjob_manifest

__all__ = ["SBATCH_GAPS", "TRAINJOB_GAPS", "GAP", "SLURM_HEAD", "K8S_HEAD", "sbatch_template",
           "trainjob_template", "fill", "reference"]

SBATCH_GAPS = ("nodes", "tasks_per_node", "gpus_per_node", "nproc_per_node", "rdzv_endpoint")
TRAINJOB_GAPS = ("nodes", "gpus_per_node", "nproc_per_node", "rdzv_endpoint")
_N, _G = 7919, 7907  # sizes no real job has: where they appear, a gap goes
GAP = re.compile(r"<(\w+)>")
SLURM_HEAD = "$HEAD_NODE_ADDR:29500"                       # where the sbatch script's agents meet
K8S_HEAD = "${PET_MASTER_ADDR}:${PET_MASTER_PORT}"          # where the TrainJob's agents meet


def _worded(text: str, endpoint: str) -> str:
    """The file as the template words it (comments that would give a gap away, reworded)."""
    return (text.replace(f"the store at {endpoint} has", "the rendezvous store has")
            .replace("=1          # one torchrun agent per node", "=1"))


def _gapped(text: str, endpoint: str, tasks: bool) -> str:
    text = _worded(text, endpoint)
    pairs = [(f"--nodes={_N}", "--nodes=<nodes>"), (f"--nnodes={_N}", "--nnodes=<nodes>"),
             (f"numNodes: {_N}", "numNodes: <nodes>"),
             (f"--gpus-per-node={_G}", "--gpus-per-node=<gpus_per_node>"),
             (f"nvidia.com/gpu: {_G}", "nvidia.com/gpu: <gpus_per_node>"),
             (f"--nproc-per-node={_G}", "--nproc-per-node=<nproc_per_node>"),
             (f"--rdzv-endpoint={endpoint}", "--rdzv-endpoint=<rdzv_endpoint>")]
    if tasks:
        pairs.append(("--ntasks-per-node=1", "--ntasks-per-node=<tasks_per_node>"))
    for old, new in pairs:
        text = text.replace(old, new)
    return text


def sbatch_template(args: list[str]) -> str:
    """The ``sbatch`` script for ``args`` (:func:`~course_lib.capstone.cluster.script_args`)
    with gaps ``<nodes>``, ``<tasks_per_node>``, ``<gpus_per_node>``, ``<nproc_per_node>`` and
    ``<rdzv_endpoint>``."""
    return _gapped(slurm_script(_N, _G, args), SLURM_HEAD, tasks=True)


def trainjob_template(args: list[str]) -> str:
    """The Kubeflow ``TrainJob`` for ``args`` with gaps ``<nodes>``, ``<gpus_per_node>``,
    ``<nproc_per_node>`` and ``<rdzv_endpoint>``."""
    return _gapped(trainjob_manifest(_N, _G, args), K8S_HEAD, tasks=False)


def fill(template: str, **values: object) -> str:
    """``template`` with each gap ``<name>`` replaced by ``values[name]`` (``...``: left open)."""
    unknown = set(values) - set(GAP.findall(template))
    if unknown:
        raise ValueError(f"the template has no gap {sorted(unknown)}; its gaps: "
                         f"{sorted(set(GAP.findall(template)))}")
    return GAP.sub(lambda m: m.group(0) if values.get(m.group(1), ...) is ...
                    else str(values[m.group(1)]), template)




def reference(kind: str, nnodes: int, gpus_per_node: int, args: list[str]) -> str:
    """The file a right answer gives: ``kind`` "sbatch" or "trainjob"."""
    if kind == "sbatch":
        return _worded(slurm_script(nnodes, gpus_per_node, args), SLURM_HEAD)
    if kind == "trainjob":
        return _worded(trainjob_manifest(nnodes, gpus_per_node, args), K8S_HEAD)
    raise ValueError(f"kind must be 'sbatch' or 'trainjob', got {kind!r}")
