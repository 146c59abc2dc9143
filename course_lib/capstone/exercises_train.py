"""Chapter 12's exercise: the learner's whole ``train.py``, run on 4 real ranks and checked.

:func:`check_train_script` writes the learner's script into a private temp folder and runs it
under the real torchrun on 4 CPU ranks (``--tp 2``: dp 2 × tp 2, fp32 so that the comparison is
tight, a low ``--clip`` so that clipping acts at every step), through ``train_watch.py``, which
records what the script did without changing it. Meanwhile the course's ``scripts/train.py``
runs as one process with the same options: the reference. The learner's losses must match it
within ``TOLERANCE`` (1e-4: float32 sums in another order); where they do not, or where the run
wastes communication, the message says where to look (the sampler's epochs, the norm clipped
by, the root module's sharding, the gradient syncs during accumulation), never the answer.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from course_lib.capstone.train_watch import WATCH_ENV
from course_lib.exercises import Feedback
from course_lib.launcher.script_magic import TOLERANCE, parse_losses
from course_lib.launcher.torchrun import TorchrunError, torchrun

__all__ = ["check_train_script", "run_learner", "verdict", "reference_losses", "ARGS", "TOLERANCE"]

ARGS = ("--tp", "2", "--dtype", "fp32", "--clip", "0.25", "--steps", "8", "--accum", "2")
_ROOT = Path(__file__).resolve().parents[2]
_ROOM = _ROOT / "course_lib" / "scripts"
_WATCH = Path(__file__).resolve().with_name("train_watch.py")
_NAME = "train_script"
_REFERENCE: dict[tuple, list[float]] = {}  # ARGS -> the one-process losses, once per kernel


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (_ROOM, _ROOT))),
            "OMP_NUM_THREADS": "1", **extra}


def _start_reference(folder: str, args: tuple) -> subprocess.Popen:
    """The course's train.py alone (dp = tp = 1), in its own working folder."""
    os.mkdir(cwd := os.path.join(folder, "reference"))
    return subprocess.Popen([sys.executable, str(_ROOM / "train.py"), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())


def reference_losses(args: tuple = ARGS, timeout: float = 300.0) -> list[float]:
    """The one-process losses of the course's train.py with ``args`` (computed once)."""
    if args not in _REFERENCE:
        with tempfile.TemporaryDirectory(prefix="course_lib_train_") as folder:
            _REFERENCE[args] = _finish_reference(_start_reference(folder, args), timeout)
    return _REFERENCE[args]


def _finish_reference(proc: subprocess.Popen, timeout: float) -> list[float]:
    out = proc.communicate(timeout=timeout)[0]
    if proc.returncode:
        raise RuntimeError(f"the course's train.py failed alone:\n{out[-2000:]}")
    return parse_losses(out)


def _events(folder: str) -> dict[int, list[dict]]:
    """Each rank's recorded events (train_watch.py), in order."""
    out = {}
    for path in Path(folder).glob("rank*.jsonl"):
        lines = path.read_text(encoding="utf-8").splitlines()
        out[int(path.stem[4:])] = [json.loads(line) for line in lines if line.strip()]
    return out


def run_learner(text: str, nprocs: int = 4, args: tuple = ARGS, timeout: float = 300.0):
    """Run ``text`` under torchrun through train_watch.py; returns (output, error or None,
    events per rank, the reference losses)."""
    with tempfile.TemporaryDirectory(prefix="course_lib_train_") as folder, \
            contextlib.chdir(folder):
        script, watched = os.path.join(folder, f"{_NAME}.py"), os.path.join(folder, "watch")
        Path(script).write_text(text, encoding="utf-8")
        os.mkdir(watched)
        reference = None if args in _REFERENCE else _start_reference(folder, args)
        error = None
        try:
            output = torchrun(str(_WATCH), nprocs, [script, *args], timeout=timeout, quiet=True,
                              env={WATCH_ENV: watched, "PYTHONPATH": _env()["PYTHONPATH"]}).output
        except TorchrunError as err:
            output, error = err.output, err
        finally:
            if reference is not None:
                _REFERENCE[args] = _finish_reference(reference, timeout)
        return output, error, _events(watched), _REFERENCE[args]


def check_train_script(text, nprocs: int = 4, timeout: float = 300.0) -> Feedback:
    """Run the learner's train.py (its text) on ``nprocs`` ranks with ``--tp 2``; compare with
    the course's script alone; say what to look at where it differs or wastes communication."""
    name = "train.py"
    if text is None or text is Ellipsis or not str(text).strip():
        return Feedback(False, "not answered yet: pass your script's text", name)
    output, error, events, reference = run_learner(str(text), nprocs, ARGS, timeout)
    return verdict(parse_losses(output), reference, events, error, output, name)


def verdict(losses, reference, events, error, output, name="train.py") -> Feedback:
    """The check's judgement of one run: its losses, the reference's, what train_watch.py
    recorded per rank, the torchrun error (or None) and the output."""
    ranks = [e for rank in sorted(events) for e in events[rank]]
    shards = [e["module"] for e in ranks if e["kind"] == "shard"]
    steps = [e for e in events.get(0, []) if e["kind"] == "step"]
    details = str(error) if error else output[-3000:]
    if shards and "GPT" not in shards:
        return Feedback(False, "the root module is not sharded: its embeddings, final norm and "
                        "head stay whole on every rank. Look at what you hand fully_shard.", name,
                        details)
    if error is not None:
        return Feedback(False, f"your script failed on rank {error.rank}: read its traceback "
                        "below.", name, details)
    if not losses:
        return Feedback(False, "your script printed no 'step N loss X' line on rank 0.", name,
                        details)
    epochs = {}
    for rank in events:
        seen = [e["epoch"] for e in events[rank] if e["kind"] == "epoch"]
        epochs[rank] = len(seen) > 1 and len(set(seen)) < len(seen)
    if any(epochs.values()):
        return Feedback(False, "every epoch your ranks read the windows in the same order: look "
                        "at what tells the sampler that a new epoch began.", name, details)
    clip = float(ARGS[ARGS.index("--clip") + 1])
    if steps and max(e["norm"] for e in steps) > clip * 1.01:
        worst = max(e["norm"] for e in steps)
        return Feedback(False, f"after clipping, the whole gradient's norm is {worst:.3f}, above "
                        f"--clip {clip}: look at which norm you clip by — a rank holds only a "
                        "shard of each gradient.", name, details)
    units = len([e for e in events.get(0, []) if e["kind"] == "shard"])
    syncs = max((e["reduce_scatters"] for e in steps), default=0)
    if units and syncs > units:
        return Feedback(False, f"each optimizer step reduce-scatters the gradients {syncs // units} "
                        f"times ({syncs} reduce-scatters for {units} FSDP units): look at when "
                        "FSDP2 should synchronise gradients during accumulation.", name, details)
    if len(losses) != len(reference):
        return Feedback(False, f"your script printed {len(losses)} loss lines; one process prints "
                        f"{len(reference)}.", name, details)
    worst, at = max((abs(a - b), k) for k, (a, b) in enumerate(zip(losses, reference)))
    if worst > TOLERANCE:
        return Feedback(False, f"your losses leave the one-process curve at step {at} (by "
                        f"{worst:.1e}): compare what each rank computes there with one process.",
                        name, details)
    return Feedback(True, f"4 ranks (dp 2 × tp 2) follow the one-process curve: final loss "
                    f"{losses[-1]:.6f}, one process {reference[-1]:.6f}.", name)
