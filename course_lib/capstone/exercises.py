"""Checks of chapter 12's exercises: the learner's train.py and the cluster files.

:func:`grade_train_py` takes the learner's ``train.py`` (the course's script with its gaps
filled): "to do" while a gap is left, then the check of :mod:`~course_lib.capstone.exercises_train`
(a grader not named ``check_``: the exercise is the script's gaps, not a value the notebook's
exercise runner can swap).

:func:`check_sbatch` and :func:`check_trainjob` read a filled template
(:mod:`course_lib.capstone.jobfiles`) as Slurm, Kubernetes and torchrun would (the ``#SBATCH``
lines, the TrainJob's fields, torchrun's flags), say which value is off and in which direction,
and pass only the file :mod:`course_lib.capstone.cluster` writes.
"""
from __future__ import annotations

import json
import re
import shlex

from course_lib.capstone.jobfiles import GAP, K8S_HEAD, SLURM_HEAD, reference
from course_lib.capstone.exercises_train import check_train_script
from course_lib.exercises import Feedback, check_number

__all__ = ["check_sbatch", "check_trainjob", "grade_train_py", "check_training_days"]


def _field(text: str, key: str) -> str | None:
    """The value of ``key:`` on a line of the TrainJob (its first occurrence)."""
    found = re.search(rf"^\s*{re.escape(key)}:\s*(.+?)\s*$", text, re.M)
    return found.group(1) if found else None


def _torchrun_flags(command: str) -> dict[str, str]:
    argv = shlex.split(command)
    if "torchrun" not in argv:
        return {}
    flags = {}
    for word in argv[argv.index("torchrun") + 1:]:
        if not word.startswith("--"):
            break
        name, _, value = word[2:].partition("=")
        flags[name] = value
    return flags


def _compare(name: str, got: str | None, want: int, why: str, unit: str) -> str | None:
    """A directional message when ``got`` is not ``want`` (``None``: right)."""
    if got is None:
        return f"{name} is missing."
    if not got.isdigit():
        return f"{name}={got!r} is not a whole number of {unit}."
    if int(got) == want:
        return None
    return f"{name}={got} is too {'high' if int(got) > want else 'low'}: {why}"


def _endpoint(got: str | None, head: str) -> str | None:
    if got is None:
        return "--rdzv-endpoint is missing."
    if got == head:
        return None
    host = got.rsplit(":", 1)[0]
    if host in ("localhost", "127.0.0.1", "$(hostname)", "$HOSTNAME"):
        return (f"--rdzv-endpoint={got}: every node would meet at its own address, so each node "
                "starts a job of its own. Every agent must name the same machine: the first node.")
    return (f"--rdzv-endpoint={got} is not where this job's first node listens: use the variable "
            "the file sets (or the runtime gives) for the first node, and torchrun's port.")


def _open(text: str) -> Feedback | None:
    left = sorted(set(GAP.findall(text)))
    if left or "Ellipsis" in text:
        gaps = left or ["a value still `...`"]
        return Feedback(False, f"not answered yet: fill {', '.join(gaps)} and run the cell.")
    return None


def check_sbatch(text: str, nnodes: int, gpus_per_node: int, args: list[str], *,
                 name: str = "sbatch script") -> Feedback:
    """Does the filled ``sbatch`` script start ``nnodes`` × ``gpus_per_node`` ranks that meet?"""
    if (open_ := _open(text)) is not None:
        return Feedback(False, open_.message, name)
    sbatch = dict(re.findall(r"^#SBATCH\s+--([\w-]+)(?:=(\S+))?", text, re.M))
    srun = next((line for line in text.splitlines() if line.startswith("srun ")), "")
    flags = _torchrun_flags(shlex.split(srun)[-1]) if srun else {}
    problems = [
        _compare("#SBATCH --nodes", sbatch.get("nodes"), nnodes,
                 f"the job runs on {nnodes} machines.", "nodes"),
        _compare("#SBATCH --ntasks-per-node", sbatch.get("ntasks-per-node"), 1,
                 "each Slurm task runs one torchrun agent, and the agent itself starts one rank "
                 "per GPU; more tasks would start that many agents on each node.", "tasks"),
        _compare("#SBATCH --gpus-per-node", sbatch.get("gpus-per-node"), gpus_per_node,
                 f"each machine has {gpus_per_node} GPUs.", "GPUs"),
        _compare("torchrun --nnodes", flags.get("nnodes"), nnodes,
                 "torchrun waits for that many agents, one per node Slurm gave the job.", "nodes"),
        _compare("torchrun --nproc-per-node", flags.get("nproc-per-node"), gpus_per_node,
                 "one rank per GPU of the node.", "ranks"),
        _endpoint(flags.get("rdzv-endpoint"), SLURM_HEAD),
    ]
    return _verdict(problems, text == reference("sbatch", nnodes, gpus_per_node, args),
                    f"{nnodes} agents, one per node, each starting {gpus_per_node} ranks, all "
                    "meeting at the first node.", name)


def check_trainjob(text: str, nnodes: int, gpus_per_node: int, args: list[str], *,
                   name: str = "TrainJob") -> Feedback:
    """Does the filled ``TrainJob`` start ``nnodes`` × ``gpus_per_node`` ranks that meet?"""
    if (open_ := _open(text)) is not None:
        return Feedback(False, open_.message, name)
    nodes, gpus = _field(text, "numNodes"), _field(text, "nvidia.com/gpu")
    try:
        command = json.loads(_field(text, "command") or "")[2]
    except (ValueError, IndexError, TypeError):
        return Feedback(False, "the file no longer holds the command line of the TrainJob: run "
                        "the template cell again and fill only the gaps.", name)
    flags = _torchrun_flags(command)
    problems = [
        _compare("numNodes", nodes, nnodes, f"the job runs on {nnodes} machines.", "nodes"),
        _compare("nvidia.com/gpu", gpus, gpus_per_node, f"each machine has {gpus_per_node} GPUs.",
                 "GPUs"),
        _compare("torchrun --nnodes", flags.get("nnodes"), nnodes,
                 "torchrun waits for that many agents, one per node.", "nodes"),
        _compare("torchrun --nproc-per-node", flags.get("nproc-per-node"), gpus_per_node,
                 "one rank per GPU of the node.", "ranks"),
        _endpoint(flags.get("rdzv-endpoint"), K8S_HEAD),
    ]
    return _verdict(problems, text == reference("trainjob", nnodes, gpus_per_node, args),
                    f"{nnodes} pods, each an agent starting {gpus_per_node} ranks, all meeting at "
                    "the first pod.", name)


def _verdict(problems: list, as_reference: bool, passed: str, name: str) -> Feedback:
    """The first two problems found; else whether the file is the reference's, byte for byte."""
    problems = [p for p in problems if p]
    if problems:
        return Feedback(False, " ".join(problems[:2]), name)
    if not as_reference:
        return Feedback(False, "the values are right but the file differs elsewhere: run the "
                        "template cell again and fill only the gaps.", name)
    return Feedback(True, passed, name)


_TRAIN_GAP = re.compile(r"^\s*\.\.\.\s+# GAP (\w+):", re.M)


def grade_train_py(text: str, timeout: float = 300.0) -> Feedback:
    """The learner's ``train.py``: while a ``...  # GAP N:`` line is left, "to do" (nothing
    starts); then :func:`~course_lib.capstone.exercises_train.check_train_script` runs it on 4
    ranks beside the course's script alone and says where to look."""
    left = _TRAIN_GAP.findall(text)
    if left:
        return Feedback(False, f"not answered yet: fill GAP {', '.join(left)} and run the cell.",
                        "train.py")
    return check_train_script(text, timeout=timeout)


def check_training_days(days: object, plan, choice: object, tokens: float = 15e12) -> Feedback:
    """Days to train on ``tokens`` tokens with every GPU of ``plan`` at the predicted tokens/s per
    GPU of the row ``choice`` (a row of ``plan.rows`` or its label), within 2 %."""
    name = "days to train"
    rows = {r.label: r for r in plan.rows}
    row = rows.get(choice) if isinstance(choice, str) else choice
    if row not in plan.rows:
        return Feedback(False, "not answered yet: choose your layout (`answer`) first.", name)
    expected = tokens / (row.tokens_per_s_gpu * plan.gpus) / 86400
    return check_number(days, expected, rtol=0.02, name=name, unit="days",
                        hint="count every GPU of the job, and convert seconds to days")
