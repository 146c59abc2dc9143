"""course_lib.torchrun: real torchrun jobs from Python, errors with the rank, no orphans."""
from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

from course_lib.launcher.torchrun import TorchrunError, cluster_command, torchrun, torchrun_command
from course_lib.launcher import launch
from course_lib.launcher import torchrun as tr  # the module; course_lib.torchrun is the function
from processes import wait_gone


def test_a_module_runs_on_every_rank_with_prefixed_output(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    job = torchrun("course_lib.scripts.hello_allreduce", 3, module=True)
    assert os.listdir(tmp_path) == []  # no torchelastic_* folder left behind
    ranks = sorted(line for line in job.output.splitlines() if line.startswith("[rank"))
    assert ranks == [f"[rank {r}] rank {r} of 3: sum of (rank + 1) over all ranks = 6"
                     for r in range(3)]
    assert "[rank 1] rank 1 of 3" in capsys.readouterr().out


def test_no_rank_returns_from_init_before_every_rank_is_connected(tmp_path):
    """Rank 0 finishes init_process_group 1 s late; rank 1 must still be inside
    init_distributed then (a rank that left at once could reset rank 0's gloo handshake)."""
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent("""
        import os, time
        import torch.distributed as dist
        real = dist.init_process_group
        def late(*args, **kwargs):
            real(*args, **kwargs)
            if os.environ["RANK"] == "0":
                time.sleep(1.0)
            print("connected", os.environ["RANK"], repr(time.time()), flush=True)
        dist.init_process_group = late
        from course_lib.launcher.torchrun import init_distributed
        rank, world = init_distributed()
        print("returned", rank, repr(time.time()), flush=True)
    """))
    job = torchrun(str(script), 2, quiet=True, timeout=120)
    seen = {(what, int(rank)): float(t) for what, rank, t in
            re.findall(r"(connected|returned) (\d) ([\d.]+)", job.output)}
    assert len(seen) == 4, job.output
    assert seen["returned", 1] >= seen["connected", 0], seen


def test_a_failing_rank_is_named_with_its_traceback(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import torch.distributed as dist
        from course_lib.launcher.torchrun import init_distributed
        rank, world = init_distributed()
        if rank == 1:
            raise RuntimeError("rank one gives up")
        # rank 0 succeeds: a barrier here would make it fail too, and torchrun would then
        # name whichever failure it noticed first
    """))
    with pytest.raises(TorchrunError) as info:
        torchrun(str(script), 2, quiet=True, timeout=120)
    assert info.value.rank == 1 and info.value.returncode != 0
    assert "RuntimeError: rank one gives up" in str(info.value)


def test_killing_the_launching_process_leaves_no_workers(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import os, sys, time\n"
                      f"open(os.path.join({str(tmp_path)!r}, 'pid' + os.environ['RANK']), 'w')"
                      ".write(str(os.getpid()))\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c",
                               f"from course_lib import torchrun; torchrun({str(script)!r}, 2)"])
    end = time.monotonic() + 90
    pidfiles = [tmp_path / f"pid{r}" for r in range(2)]
    while not all(p.exists() and p.read_text() for p in pidfiles) and time.monotonic() < end:
        time.sleep(0.2)
    tree = [c.pid for c in psutil.Process(parent.pid).children(recursive=True)]
    workers = [int(p.read_text()) for p in pidfiles]
    parent.kill()  # like a Jupyter kernel killed with SIGKILL
    parent.wait()
    assert set(workers) <= set(tree) | set(workers)
    assert wait_gone(tree + workers, timeout=20) == []


def test_processes_that_left_the_group_or_session_are_stopped_too(tmp_path):
    """setsid, setpgid and a double fork escape a process-group kill; the reaper (a subreaper
    that follows parent links) still finds them once torchrun is done."""
    script = tmp_path / "escapes.py"
    script.write_text(textwrap.dedent("""
        import os, subprocess, sys
        from course_lib.launcher.torchrun import init_distributed
        rank, world = init_distributed()
        a = subprocess.Popen(["sleep", "300"], start_new_session=True)  # setsid
        b = subprocess.Popen(["sleep", "300"], process_group=0)  # setpgid(0, 0)
        c = subprocess.run(["setsid", "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True).stdout.strip()  # double fork
        print("escaped", a.pid, b.pid, c)
    """))
    job = torchrun(str(script), 2, quiet=True, timeout=120)
    pids = [int(p) for ln in job.output.splitlines() if "escaped" in ln
            for p in ln.split("escaped", 1)[1].split()]
    assert len(pids) == 6, job.output
    assert wait_gone(pids, timeout=20) == []


def test_command_lines_are_what_a_learner_would_type():
    cmd = torchrun_command("train.py", 4, ["--steps", 10], nnodes=2, node_rank=1,
                           endpoint="10.0.0.1:29500")
    joined = " ".join(cmd)
    for part in ("-m torch.distributed.run", "--nnodes=2", "--nproc-per-node=4", "--node-rank=1",
                 "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500", "train.py --steps 10"):
        assert part in joined
    assert "--local-addr" not in joined  # only pinned on loopback
    *comment, command = cluster_command("train.py", 8, 4).splitlines()
    assert command == (
        "torchrun --nnodes=4 --nproc-per-node=8 --rdzv-backend=c10d "
        "--rdzv-endpoint=$HEAD_NODE_ADDR:29500 --rdzv-id=$JOB_ID --max-restarts=3 train.py")
    # what the store exposes, said where the command is printed (a shell comment: pastes as is)
    assert all(line.startswith("# ") for line in comment)
    assert "no authentication" in comment[0] and "private network" in comment[1]


def test_bad_requests_fail_before_starting(monkeypatch):
    monkeypatch.setattr(tr.subprocess, "Popen", lambda *a, **k: pytest.fail("started torchrun"))
    with pytest.raises(FileNotFoundError, match="no script 'nope.py'"):
        torchrun("nope.py", 2)
    with pytest.raises(ValueError, match="nprocs must be at least 1"):
        torchrun("course_lib.scripts.hello_allreduce", 0, module=True)
    for bad in (float("nan"), float("inf"), 0):
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
            torchrun("course_lib.scripts.hello_allreduce", 2, module=True, timeout=bad)
    with pytest.raises(ValueError, match=r"timeout must be at most 604800 s \(a week\)"):
        torchrun("course_lib.scripts.hello_allreduce", 2, module=True, timeout=1e15)


def test_init_distributed_runs_a_script_alone_and_inside_run(tmp_path):
    """The harness's workers join through ``init_distributed`` (the learner's scripts call
    ``init_process_group`` themselves: tests/scripts/test_learner_room.py)."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import torch
        import torch.distributed as dist
        from course_lib.launcher.torchrun import init_distributed
        def main():
            rank, world = init_distributed()
            value = torch.tensor([rank + 1.0])
            dist.all_reduce(value)
            print(f"rank {rank} of {world}: sum = {value.item():g}", flush=True)
            return value.item()
        if __name__ == "__main__":
            main()
    """))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "TMPDIR": str(scratch)})
    assert out.returncode == 0, out.stderr
    assert os.listdir(scratch) == []  # alone: no store file left behind
    assert "rank 0 of 1: sum = 1" in out.stdout
    main = runpy.run_path(str(script))["main"]
    assert launch.run(main, 3) == [6.0, 6.0, 6.0]


def test_the_first_script_refuses_to_run_without_torchrun(tmp_path):
    """Chapter 00's script calls init_process_group itself: alone, torch says what is missing."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = subprocess.run([sys.executable, "-m", "course_lib.scripts.hello_allreduce"],
                         capture_output=True, text=True, timeout=60, env={**env, "TMPDIR": str(tmp_path)})
    assert out.returncode != 0 and "environment variable RANK expected" in out.stderr


def test_the_agents_stores_listen_on_loopback_only(tmp_path):
    script = tmp_path / "listeners.py"
    script.write_text(textwrap.dedent("""
        import os, psutil
        from course_lib.launcher.torchrun import init_distributed
        rank, world = init_distributed()
        agent = psutil.Process(os.getppid())  # torchrun's agent hosts the stores
        found = sorted({c.laddr.ip for c in agent.net_connections("tcp") if c.status == "LISTEN"})
        print("agent listens on", ",".join(found))
    """))
    job = torchrun(str(script), 2, quiet=True, timeout=120)
    lines = [ln for ln in job.output.splitlines() if "agent listens on" in ln]
    assert len(lines) == 2 and all(ln.endswith("agent listens on 127.0.0.1") for ln in lines), lines


def test_the_error_keeps_the_ranks_traceback_whatever_gloo_logs_after_it():
    """Under load a dying rank's peer can go first: gloo then logs many lines after the traceback
    (seen in CI), and the last 20 lines alone lost the exception."""
    lines = ["[rank 1] Traceback (most recent call last):", '[rank 1]   File "x.py", line 6',
             "[rank 1] RuntimeError: rank one gives up"]
    lines += [f"[rank 1] [E1202 ProcessGroupGloo.cpp] peer closed the connection {k}"
              for k in range(40)]
    assert "RuntimeError: rank one gives up" in str(TorchrunError(1, 1, "\n".join(lines)))
    assert "[rank 1] last" in str(TorchrunError(1, 1, "[rank 0] a\n[rank 1] last"))
