"""The warm server's start: ``warm_up(wait=False)`` returns at once, and what it preimports."""
from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch.distributed as dist

from course_lib.launcher import _warm, launch
from course_lib.launcher.launch import run, warm_up
from course_lib.sharding import formulas as zero
from course_lib.sharding.strategies import train_rank_sharded
from processes import wait_gone

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def test_importing_the_launcher_does_not_import_torch():
    # so that warm_up(wait=False) can start the server before a notebook's own `import torch`
    code = "import sys; from course_lib import warm_up; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": _ROOT}, timeout=120)
    assert out.stdout.strip() == "False"


def test_warm_up_without_waiting_returns_a_starting_server_that_run_then_uses(monkeypatch):
    cache = launch._ServerCache()
    monkeypatch.setattr(launch, "_SERVERS", cache)
    warm_up(wait=False)
    server = cache._server
    assert server is not None and not server.ready  # nobody has read its "ready" yet
    assert run(dist.get_world_size, 2) == [2, 2]  # waits for the rest of the start, then forks
    assert server.ready and cache.get() is server  # the same server, not a second one
    warm_up()  # a ready server: returns at once, starts nothing
    assert cache._server is server
    server.proc.stdin.close()  # what a kernel's exit does: the server goes
    assert wait_gone([server.proc.pid], timeout=30) == []
    server.proc.wait()


def test_a_server_that_dies_while_starting_is_reported_and_replaced(monkeypatch):
    cache = launch._ServerCache()
    monkeypatch.setattr(launch, "_SERVERS", cache)
    warm_up(wait=False)
    first = cache._server
    first.proc.kill()
    first.proc.wait()
    with pytest.raises(RuntimeError, match="warm server did not start"):
        first.wait_ready()
    assert run(dist.get_rank, 2) == [0, 1]  # the next run starts a fresh server
    assert cache._server is not first
    cache._server.proc.stdin.close()
    cache._server.proc.wait()


def _notebook_function():
    return train_rank_sharded, zero.paper_bytes, os.getpid, (lambda: zero)


def test_preimports_name_the_course_lib_modules_a_notebook_function_uses():
    fn = types.FunctionType(_notebook_function.__code__, _notebook_function.__globals__)
    fn.__module__ = "__main__"  # as a function typed in a notebook cell (shipped by value)
    assert set(_warm.preimports_of(fn)) == {"course_lib.sharding.strategies",
                                           "course_lib.sharding.formulas"}
    by_reference = _warm.preimports_of(train_rank_sharded)
    assert by_reference == ("course_lib.sharding.strategies",)
    assert _warm.preimports_of(print) == ()
    plain = types.FunctionType((lambda: os.getpid()).__code__, {"os": os, "__name__": "__main__"})
    assert _warm.preimports_of(plain) == ()  # only course_lib modules: os is no business of ours
