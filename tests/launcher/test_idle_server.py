"""A chapter left idle gives its warm server's memory back, and the next ``run`` starts a fresh one.

Issue 50: every open chapter kept a second process with torch loaded (0.44-0.54 GiB), so a few
chapters left open filled a learner's pod. The server now ends after ``COURSE_HELPER_IDLE_SECONDS``
without a run; these tests use 1 s instead of the default 120 s.
"""
from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from course_lib.launcher import _server_cache, launch
from course_lib.launcher.launch import run
from processes import wait_gone

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


@pytest.fixture
def cache(monkeypatch):
    monkeypatch.setenv("COURSE_HELPER_IDLE_SECONDS", "1")
    fresh = launch._ServerCache()
    monkeypatch.setattr(launch, "_SERVERS", fresh)
    yield fresh
    if fresh._server is not None:
        fresh._server.close()


def test_an_idle_server_ends_and_the_next_run_starts_a_fresh_one(cache):
    assert run(dist.get_rank, 2) == [0, 1]
    first = cache._server
    assert first.alive()
    # the watcher looks every 0.25 s here; allow a loaded machine many times that
    assert wait_gone([first.proc.pid], timeout=30) == [], "the idle server was not ended"
    assert cache._server is None
    assert run(dist.get_world_size, 2) == [2, 2]  # a fresh server, the same answers
    assert cache._server is not first and cache._server.alive()


def test_a_run_longer_than_the_idle_time_is_never_cut(cache):
    def slow():
        time.sleep(3)  # three times the idle limit, with the server held busy all along
        return dist.get_rank()

    assert run(slow, 2) == [0, 1]
    assert cache._server is not None and cache._server.alive()  # ended only after idling


def test_zero_keeps_the_server(monkeypatch, cache):
    monkeypatch.setenv("COURSE_HELPER_IDLE_SECONDS", "0")
    assert run(dist.get_rank, 2) == [0, 1]
    time.sleep(2)
    assert cache._server is not None and cache._server.alive()


def test_a_bad_idle_setting_is_named(monkeypatch):
    monkeypatch.setenv("COURSE_HELPER_IDLE_SECONDS", "two minutes")
    with pytest.raises(ValueError, match="COURSE_HELPER_IDLE_SECONDS must be a number"):
        launch.idle_seconds()


def test_torchrun_ends_the_idle_server_while_it_runs_and_starts_it_again_after(monkeypatch, cache):
    """torchrun's own processes import torch anew: the idle rank server beside them is only
    weight on the chapter's peak (issue 50), so it is ended for the job and started again."""
    from course_lib.launcher import torchrun as torchrun_module

    monkeypatch.setenv("COURSE_PAUSE_SERVER", "1")  # as in a learner's pod (auto: a small limit)
    assert run(dist.get_rank, 2) == [0, 1]
    first = cache._server
    seen = {}

    def job(*args, **kwargs):  # instead of the real torchrun: what the job sees around it
        seen["server"] = cache._server
        seen["first gone"] = wait_gone([first.proc.pid], timeout=30) == []
        return "done"

    monkeypatch.setattr(torchrun_module, "_torchrun", job)
    assert torchrun_module.torchrun(__file__, 2) == "done"
    assert seen == {"server": None, "first gone": True}, "the server ran beside torchrun"
    assert cache._server is not None and cache._server is not first  # started again, in the
    assert run(dist.get_rank, 2) == [0, 1]                              # background; it serves


def test_in_a_notebook_the_server_starts_again_only_once_the_cell_has_finished(monkeypatch,
                                                                            cache):
    """In a cell, what follows torchrun (``%%torchrun``'s one-process reference imports torch
    too) would run beside a restarting server: it starts after the cell (issue 50)."""
    from IPython.core.events import EventManager, available_events
    import IPython

    class Shell:
        events = EventManager(None, available_events)
    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell)
    monkeypatch.setenv("COURSE_PAUSE_SERVER", "1")
    assert run(dist.get_rank, 2) == [0, 1]
    first = cache._server
    with launch.server_paused():
        assert cache._server is None
    assert cache._server is None, "started again before the cell finished"
    Shell.events.trigger("post_run_cell", None)
    assert cache._server is not None and cache._server is not first
    assert Shell.events.callbacks["post_run_cell"] == []  # once, not after every cell
    assert run(dist.get_rank, 2) == [0, 1]


def test_a_server_in_use_or_never_started_is_not_paused(monkeypatch, cache):
    monkeypatch.setenv("COURSE_PAUSE_SERVER", "1")
    with launch.server_paused():  # none running: nothing ended, none started after
        pass
    assert cache._server is None
    with cache.using() as server:
        assert cache.end() is False and server.alive()  # a run holds it


def test_the_server_is_paused_for_torchrun_only_in_a_small_pod_unless_told(monkeypatch):
    monkeypatch.delenv("COURSE_PAUSE_SERVER", raising=False)
    for limit, paused in ((1 << 30, True), (2 << 30, True), (16 << 30, False), (None, False)):
        monkeypatch.setattr(_server_cache, "memory_limit", lambda: limit)
        assert _server_cache.pauses_for_torchrun() is paused, limit
    monkeypatch.setattr(_server_cache, "memory_limit", lambda: 1 << 30)
    monkeypatch.setenv("COURSE_PAUSE_SERVER", "0")
    assert _server_cache.pauses_for_torchrun() is False
    monkeypatch.setattr(_server_cache, "memory_limit", lambda: None)
    monkeypatch.setenv("COURSE_PAUSE_SERVER", "1")
    assert _server_cache.pauses_for_torchrun() is True
    monkeypatch.setenv("COURSE_PAUSE_SERVER", "yes")
    with pytest.raises(ValueError, match="COURSE_PAUSE_SERVER must be 0, 1 or auto"):
        _server_cache.pauses_for_torchrun()


def test_the_memory_limit_is_a_positive_number_of_bytes_or_none():
    limit = launch.memory_limit()
    assert limit is None or 0 < limit < 2 ** 60


def test_chapter_modules_a_kernel_imports_leave_torch_dynamo_to_the_ranks():
    """torch._dynamo (via torch's memory tracker: torch.distributed._tools -> torch._inductor)
    costs a kernel ~0.07 GiB and ~1.4 s of CPU; these modules use it only inside ranks, which
    the warm server's preload serves (issue 50)."""
    import subprocess
    import sys

    modules = ["course_lib.communication.scaling", "course_lib.communication.show",
               "course_lib.data_parallel.ddp_internals", "course_lib.capstone.train",
               "course_lib.capstone.measure", "course_lib.communicating_less.measure"]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

def test_the_kernel_trims_its_heap_before_ranks_start_only_in_a_pod(monkeypatch, cache):
    """In a learner's pod the kernel gives its freed heap back before a run (chapter 09's
    in-kernel reference step left ~0.07 GiB of it); elsewhere no run pays for the trim."""
    calls = []

    class Libc:
        def malloc_trim(self, pad):
            calls.append(pad)

    monkeypatch.setattr(launch.ctypes, "CDLL", lambda name: Libc())
    for pause, trims in (("0", []), ("1", [0])):
        monkeypatch.setenv("COURSE_PAUSE_SERVER", pause)
        calls.clear()
        assert run(dist.get_rank, 2) == [0, 1]
        assert calls == trims, pause


def test_in_a_pod_the_magic_runs_its_one_process_reference_after_torchrun(monkeypatch):
    """%%torchrun's one-process reference (a third interpreter with torch and DDP, ~0.25 GiB)
    ran beside torchrun's agent and workers; in a learner's pod it starts once they have ended."""
    from types import SimpleNamespace

    from course_lib.launcher import script_magic

    for pause, order in (("0", ["alone", "torchrun"]), ("1", ["torchrun", "alone"])):
        monkeypatch.setenv("COURSE_PAUSE_SERVER", pause)
        events = []
        monkeypatch.setattr(script_magic, "torchrun", lambda *a, **k: events.append("torchrun")
                            or SimpleNamespace(output="loss 1.0"))
        monkeypatch.setattr(script_magic, "_start_alone", lambda *a: events.append("alone")
                            or SimpleNamespace(poll=lambda: 0))
        monkeypatch.setattr(script_magic, "_finish_alone", lambda proc, *a: "loss 1.0")
        script_magic.run_script("print(1)\n", 2)
        assert events == order, pause
