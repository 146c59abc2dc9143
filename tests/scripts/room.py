"""Helpers for the learner's-room tests: what a copy of ``course_lib/scripts/`` may lean on, and
plain ``torchrun`` lines run in a private network namespace.

What a copy of the room may use, exactly: ``course_lib/__init__.py`` (the package's lazy facade: it imports only
``common.deprecation``), ``course_lib/common/`` (the GPT, its ``Stage`` and ``qkv_rows``, the
corpus reader) and ``data/corpus.txt`` (``common.data`` reads it beside ``course_lib``). Nothing
else of the course is importable there: a ``sitecustomize`` drops setuptools' editable-install
finder, which would otherwise serve any ``course_lib.X`` from the developer's checkout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOM = REPO / "course_lib" / "scripts"
# the scripts a learner copies: they import from the course only `tiny` (MOVED's files are the
# deprecated old paths of the harness's workers, gone next release)
LEARNER = ["hello_allreduce.py", "ddp.py", "fsdp.py", "tensor_parallel.py", "pipeline.py",
           "checkpoint.py", "mesh_2d.py", "train.py"]

_NO_EDITABLE = '''import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")
                    and not type(f).__module__.startswith("__editable__")]
'''


def allowed_course(folder: Path) -> Path:
    """``folder`` holding only what the room may use (module docstring); returns it."""
    (folder / "course_lib").mkdir(parents=True)
    shutil.copy(REPO / "course_lib" / "__init__.py", folder / "course_lib")
    shutil.copytree(REPO / "course_lib" / "common", folder / "course_lib" / "common",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "data").mkdir()
    shutil.copy(REPO / "data" / "corpus.txt", folder / "data")
    (folder / "sitecustomize.py").write_text(_NO_EDITABLE)
    return folder


def env_with_path(*paths: Path) -> dict:
    """This environment with ``PYTHONPATH`` = ``paths`` only, one thread per process."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)), "OMP_NUM_THREADS": "1"}


def start_torchrun(argv: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    """``torchrun ARGS`` (as typed: ``argv[0] == "torchrun"``) in a private network namespace, so
    ``--standalone``'s unauthenticated stores are reachable from nowhere; output collected."""
    from course_lib.launcher.torchrun import start_reaped
    assert argv[0] == "torchrun", argv
    cmd = ["env", f"PYTHONPATH={env['PYTHONPATH']}", sys.executable, "-m", "torch.distributed.run",
           *argv[1:]]
    reaper_env = {**env, "PYTHONPATH": str(REPO)}  # the reaper is the course's; the job is not
    proc, shared, _ = start_reaped(cmd, "private-only", stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
                                   env=reaper_env)
    if shared:
        if os.environ.get("COURSE_REQUIRE_NETNS") == "1":
            pytest.fail(f"no private network namespace here: {shared}")
        pytest.skip(f"no private network namespace here ({shared}): --standalone would listen "
                    "on the shared loopback")
    return proc


def start_python(argv: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Exit code and output. Stdin stays open meanwhile: closing it tells the reaper to kill."""
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        proc.stdin.close()
        proc.kill()
        proc.wait(30)
        pytest.fail(f"{proc.args} did not finish within {timeout:g} s")
    code = proc.wait()
    proc.stdin.close()
    return code, out[0].decode("utf-8", "replace")
