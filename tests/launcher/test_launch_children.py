"""What a rank starts ends with it: on a timeout, after a success, and when the parent dies."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
import torch.distributed as dist

from course_lib.launcher.launch import run
from processes import wait_gone

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def _start_sleep_then(path, hang):
    child = subprocess.Popen(["sleep", "600"])  # inherits the rank's stdout: holds its pipe
    with open(f"{path}.{dist.get_rank()}", "w") as f:
        f.write(str(child.pid))
    if hang:
        time.sleep(600)
    return child.pid


def test_a_timeout_ends_what_a_rank_started_within_the_timeout(tmp_path):
    path = str(tmp_path / "child")
    run(_start_sleep_then, 1, path, False)  # warm server: the timeout below measures the run
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        run(_start_sleep_then, 2, path, True, timeout=3)
    elapsed = time.monotonic() - t0
    children = [int(open(f"{path}.{r}").read()) for r in range(2)]
    assert wait_gone(children, timeout=5) == []
    # before: the sleeping child held the rank's output open and cleanup waited 5 s for it
    assert elapsed < 3 + 4, elapsed


def test_a_successful_rank_leaves_no_child_behind(tmp_path):
    children = run(_start_sleep_then, 2, str(tmp_path / "child"), False)
    assert wait_gone(children, timeout=10) == []
