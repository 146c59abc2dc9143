"""COURSE_TORCHRUN_WORKERS: torchrun's workers forked from its agent, torch preloaded (issue 50),
by default in a learner's pod (``auto``: where the warm server is paused for torchrun).

The same torchrun (agent, rendezvous, log prefixes, exit codes); each worker must still see what
``python -u SCRIPT`` gives it (``__main__``, ``sys.argv``, its rank's environment) and fail as
one would (its rank and traceback named).
"""
from __future__ import annotations

import textwrap

import pytest

from course_lib.launcher.torchrun import TorchrunError, torchrun, worker_mode

SCRIPT = """
import os, sys
preloaded = "torch._dynamo" in sys.modules  # imported before this line only in a forked worker
from course_lib.launcher.torchrun import init_distributed
rank, world = init_distributed()
print(f"seen {__name__} {sys.argv[1:]} {os.environ['LOCAL_RANK']} {preloaded}", flush=True)
if rank == 1 and "fail" in sys.argv:
    raise RuntimeError("rank one gives up")
"""


@pytest.mark.parametrize("mode", ["fork", "fresh"])
def test_a_worker_sees_what_a_fresh_interpreter_would(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("COURSE_TORCHRUN_WORKERS", mode)
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(SCRIPT))
    job = torchrun(str(script), 2, ["x", "7"], quiet=True, timeout=120)
    seen = sorted(line for line in job.output.splitlines() if " seen " in line)
    preloaded = mode == "fork"  # the forked workers found torch._dynamo already there
    assert seen == [f"[rank {r}] seen __main__ ['x', '7'] {r} {preloaded}" for r in range(2)], \
        job.output


def test_a_forked_worker_that_fails_is_named_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_TORCHRUN_WORKERS", "fork")
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(SCRIPT))
    with pytest.raises(TorchrunError) as info:
        torchrun(str(script), 2, ["fail"], quiet=True, timeout=120)
    assert info.value.rank == 1 and info.value.returncode != 0
    assert "RuntimeError: rank one gives up" in str(info.value)


def test_a_bad_mode_fails_before_any_process_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_TORCHRUN_WORKERS", "spawn")
    with pytest.raises(ValueError, match="COURSE_TORCHRUN_WORKERS must be auto, fresh or fork"):
        torchrun(__file__, 2)


@pytest.mark.parametrize("pause, mode", [("1", "fork"), ("0", "fresh")])
def test_auto_forks_where_the_pod_is_small(monkeypatch, pause, mode):
    monkeypatch.delenv("COURSE_TORCHRUN_WORKERS", raising=False)
    monkeypatch.setenv("COURSE_PAUSE_SERVER", pause)  # 1: as in a pod of 4 GiB or less
    assert worker_mode() == mode
    monkeypatch.setenv("COURSE_TORCHRUN_WORKERS", "fresh" if mode == "fork" else "fork")
    assert worker_mode() != mode  # an explicit choice wins


@pytest.mark.parametrize("script", ["ddp.py", "fsdp.py"])
def test_a_chapter_script_prints_the_same_forked_as_fresh(monkeypatch, script):
    """What a pod runs (forked workers) against torchrun's own fresh interpreters: the same
    losses, and the forked job ends (ddp.py once hung at its end when forked: its ``__main__``
    was freed while it ran)."""
    path = f"course_lib/scripts/{script}"
    outputs = {}
    for mode in ("fresh", "fork"):
        monkeypatch.setenv("COURSE_TORCHRUN_WORKERS", mode)
        job = torchrun(path, 2, quiet=True, timeout=120)
        outputs[mode] = [line for line in job.output.splitlines() if "loss" in line]
    assert outputs["fresh"] and outputs["fork"] == outputs["fresh"], outputs


def _echo_node():
    import sys
    line = sys.stdin.readline()
    print(f"{line.strip()} torch={'torch' in sys.modules}", flush=True)
    if "fail" in line:
        raise RuntimeError("node gives up")


@pytest.mark.parametrize("word, code", [("hello", 0), ("fail", 1)])
def test_a_forked_call_has_its_own_pipes_exit_status_and_the_parents_imports(word, code):
    """Chapter 05's link nodes are ``ForkedCall``s of a hub that imported torch once: they talk
    over their own stdin/stdout, exit with their function's status and share torch's pages."""
    import subprocess

    import torch  # noqa: F401 - in the parent: the child finds it already imported

    from course_lib.launcher._forked_workers import ForkedCall
    proc = ForkedCall(_echo_node, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(word + "\n", timeout=60)
    assert (out, proc.returncode) == (f"{word} torch=True\n", code), err
    assert ("RuntimeError: node gives up" in err) == (code == 1)
