"""CI's two conditions do what they say: busy loops that are not our children and end, and one
usable core (mask, and quota where one can be made) that is undone afterwards."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from tests.under_load import UnderLoad

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_busy_loops_spin_outside_our_process_tree_and_stop():
    load = UnderLoad(2)
    load._start()
    try:
        procs = [psutil.Process(p) for p in load.pids]
        assert len(procs) == 2
        assert not {p.pid for p in procs} & {c.pid for c in psutil.Process().children(recursive=True)}
        end = time.monotonic() + 20
        while time.monotonic() < end and not all(sum(p.cpu_times()[:2]) > 0.2 for p in procs):
            time.sleep(0.1)
        assert all(sum(p.cpu_times()[:2]) > 0.2 for p in procs)   # they spin
    finally:
        load._stop()
    assert psutil.wait_procs(procs, timeout=5)[1] == []


def test_one_core_gives_one_usable_core_and_undo_restores_the_mask():
    code = ("import os\nfrom tests.one_core import enter\n"
            "from course_lib.launcher.devices import usable_cores\n"
            "before = os.sched_getaffinity(0)\nundo, what = enter()\n"
            "print(len(os.sched_getaffinity(0)), usable_cores(), what.split()[0])\n"
            "undo()\nprint(os.sched_getaffinity(0) == before)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": ROOT}).stdout.split()
    assert out == ["1", "1", "core", "True"]


def test_the_loops_end_by_themselves_when_the_test_process_is_gone():
    code = "from tests.under_load import UnderLoad\nl = UnderLoad(1)\nl._start()\nprint(*l.pids)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": ROOT}).stdout
    procs = [psutil.Process(int(p)) for p in out.split()]
    assert procs and psutil.wait_procs(procs, timeout=20)[1] == []
