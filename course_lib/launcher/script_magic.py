"""``%%torchrun NPROC NAME.py``: run the script typed in a cell under the real torchrun, beside one process.

``%load_ext course_lib`` loads it. The cell's text becomes ``NAME.py`` in a private temp folder
(the working folder, removed afterwards: never the learner's folders), run under
:func:`course_lib.torchrun` on ``NPROC`` CPU ranks (output streamed) and, meanwhile (in a
learner's pod: after it, issue 50), as one plain process; ``course_lib/scripts/`` is on their
path, for the cell's ``import tiny``. Both print ``step N loss X`` (``tiny.log``); one line sets
the final losses side by side and says whether they agree within ``TOLERANCE``, without
printing it (1e-4: float32 sums in another order; ``TOLERANCE_BF16`` = 2e-3 for a bfloat16
policy; why: docs/decisions/scripts.md, "Why %%torchrun compares the losses within 1e-4 (2e-3
for bfloat16)"). Options after the name: ``--no-reference``, ``--timeout S``, ``-- ARGS``.
:func:`run_script` is the same without IPython, and returns the :class:`ScriptRun`.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.launcher import devices
from course_lib.launcher._server_cache import pauses_for_torchrun
from course_lib.launcher.torchrun import torchrun

__all__ = ["ScriptRun", "run_script", "parse_losses", "torchrun_magic", "load_ipython_extension",
           "TOLERANCE", "TOLERANCE_BF16"]

TOLERANCE = 1e-4
TOLERANCE_BF16 = 2e-3
# the number alone: torchrun may write another rank's "[default0]:" prefix right after it,
# before the newline, when two ranks print at once
_LOSS = re.compile(r"^(?:\[rank (\d+)\] )?step (\d+) loss ([-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf))")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.py$")
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding course_lib
_ROOM = str(Path(__file__).resolve().parents[1] / "scripts")  # tiny.py: the scripts' `import tiny`


@dataclass
class ScriptRun:
    """Losses per step of the script on ``nprocs`` ranks and (unless skipped) in one process."""

    name: str
    nprocs: int
    losses: list = field(repr=False)
    reference_losses: list | None = field(repr=False)
    tolerance: float = field(repr=False)
    output: str = field(repr=False, default="")

    @property
    def final(self) -> float | None:
        return self.losses[-1] if self.losses else None

    @property
    def reference_final(self) -> float | None:
        return self.reference_losses[-1] if self.reference_losses else None

    @property
    def difference(self) -> float | None:
        if self.final is None or self.reference_final is None:
            return None
        return abs(self.final - self.reference_final)

    @property
    def within(self) -> bool | None:
        """Whether the final losses agree within the tolerance (None: nothing to compare)."""
        return None if self.difference is None else self.difference <= self.tolerance

    def verdict(self) -> str:
        """The comparison line the magic prints."""
        ranks = f"{self.nprocs} rank{'s' * (self.nprocs != 1)}"
        if self.final is None:
            return f"{self.name}: no 'step N loss X' line on {ranks}: nothing to compare"
        if self.reference_losses is None:
            return f"{self.name}: final loss on {ranks} {self.final:.6f} (no one-process run)"
        if self.reference_final is None:
            return f"{self.name}: final loss on {ranks} {self.final:.6f}; one process printed none"
        both = f"final loss: {ranks} {self.final:.6f}, one process {self.reference_final:.6f}"
        if not self.within:
            return f"{both}: DIFFERENT (by {self.difference:.1e})"
        if self.difference:  # float sums added in another order
            return f"{both}: the same up to rounding ({self.difference:.1e})"
        return f"{both}: the same"


def parse_losses(output: str) -> list[float]:
    """The ``step N loss X`` values in step order, from the first rank that printed any."""
    found: dict[int, float] = {}
    rank_seen = None
    for line in output.splitlines():
        if not (match := _LOSS.match(line.strip())):
            continue
        rank = match.group(1)
        if rank_seen is None:
            rank_seen = rank
        if rank == rank_seen:
            found[int(match.group(2))] = float(match.group(3))
    return [found[k] for k in sorted(found)]


def tolerance_for(text: str) -> float:
    """The course's tolerance for a script: wider where it computes in bfloat16."""
    return TOLERANCE_BF16 if "bfloat16" in text else TOLERANCE


def run_script(text: str, nprocs: int, name: str = "script.py", *, reference: bool = True,
               args: tuple = (), timeout: float = 300.0, quiet: bool = False) -> ScriptRun:
    """Run ``text`` as ``name`` under torchrun on ``nprocs`` ranks, then alone; compare."""
    devices.place(nprocs)  # bad input fails here, before any process starts
    devices.validate_timeout(timeout)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"the script's name must be a plain file name ending in .py, got {name!r}")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (_ROOM, _ROOT, os.environ.get("PYTHONPATH")) if p)}
    alone = None
    # the job's working folder (0700, private to this user): what it writes stays in it
    with tempfile.TemporaryDirectory(prefix="course_lib_script_", ignore_cleanup_errors=True) \
            as folder, contextlib.chdir(folder):
        path, alone_dir = os.path.join(folder, name), os.path.join(folder, "alone")
        Path(path).write_text(text)
        try:
            if reference:
                os.mkdir(alone_dir)
            if reference and not pauses_for_torchrun():  # first: it imports torch beside the agent
                alone = _start_alone(path, args, alone_dir, env)
            output = torchrun(path, nprocs, args, timeout=timeout, env=env, quiet=quiet).output
            if reference and alone is None:  # in a pod (issue 50): not beside torchrun's processes
                alone = _start_alone(path, args, alone_dir, env)
            ref = _finish_alone(alone, name, timeout, quiet) if alone else None
        finally:
            if alone is not None and alone.poll() is None:  # torchrun failed or was stopped
                alone.kill()
                alone.wait()
    losses = parse_losses(output)
    return ScriptRun(name, nprocs, losses, None if ref is None else parse_losses(ref),
                     tolerance_for(text), output)


def _start_alone(path: str, args: tuple, cwd: str, env: dict) -> subprocess.Popen:
    """One plain process (no torchrun), in its own working folder, output collected."""
    return subprocess.Popen([sys.executable, path, *map(str, args)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env, "OMP_NUM_THREADS": "1"})


def _finish_alone(proc: subprocess.Popen, name: str, timeout: float, quiet: bool) -> str:
    """Its output, each line marked ``[one process]``; an error if it failed."""
    try:
        text = proc.communicate(timeout=timeout)[0].rstrip()
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the one-process run of {name} did not finish within {timeout:g} s; "
                           "it was stopped") from None
    if not quiet and text:
        print("\n".join(f"[one process] {line}" for line in text.splitlines()), flush=True)
    if proc.returncode:
        raise RuntimeError(f"the one-process run of {name} exited with code {proc.returncode}:\n"
                           + "\n".join(text.splitlines()[-20:]))
    return text


def _parse_line(line: str) -> tuple[int, str, bool, float, tuple]:
    words = shlex.split(line)
    args: tuple = ()
    if "--" in words:
        cut = words.index("--")
        words, args = words[:cut], tuple(words[cut + 1:])
    usage = "usage: %%torchrun NPROC NAME.py [--no-reference] [--timeout S] [-- ARGS...]"
    if len(words) < 2 or not words[0].isdigit():
        raise ValueError(usage)
    nprocs, name, rest = int(words[0]), words[1], words[2:]
    reference, timeout = True, 300.0
    while rest:
        word = rest.pop(0)
        if word == "--no-reference":
            reference = False
        elif word == "--timeout" and rest:
            timeout = float(rest.pop(0))
        else:
            raise ValueError(f"unknown option {word!r}; {usage}")
    return nprocs, name, reference, timeout, args


def torchrun_magic(line: str, cell: str) -> None:
    """The cell magic: ``%%torchrun NPROC NAME.py [--no-reference] [--timeout S] [-- ARGS]``.
    It prints; :func:`run_script` returns the :class:`ScriptRun`."""
    nprocs, name, reference, timeout, args = _parse_line(line)
    run = run_script(cell, nprocs, name, reference=reference, args=args, timeout=timeout)
    if reference or run.final is not None:  # a script with nothing to compare ends silently
        print(run.verdict(), flush=True)
    if run.final is not None and not math.isfinite(run.final):
        print("the loss is not finite: the run diverged", flush=True)


def load_ipython_extension(ipython) -> None:
    """``%load_ext course_lib.launcher.script_magic`` (or ``%load_ext course_lib``)."""
    ipython.register_magic_function(torchrun_magic, magic_kind="cell", magic_name="torchrun")
