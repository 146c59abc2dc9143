"""A failing rank's report is never empty, and a run whose ranks are gone ends (issue 57, item 6).

An exception may carry no message (``EOFError()`` is what ``multiprocessing``'s ``recv`` raises
when the other end of its pipe closed, as torchft's helper processes do): the report says so
and shows the traceback and how the process ended. A rank that dies without a traceback (a
signal, ``os._exit``) is reported with its exit status and the last lines it wrote. A rank that
started a process in a session of its own leaves that process holding its pipes: the run must
still end at once when the ranks are gone, naming each one, not wait for its timeout.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch.distributed as dist

from course_lib.launcher._rank_error import RankError
from course_lib.launcher.launch import run

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def _eof_without_message():
    if dist.get_rank() == 1:
        raise EOFError()
    time.sleep(60)


def test_an_exception_without_a_message_is_named_with_its_traceback_and_exit():
    with pytest.raises(RankError) as info:
        run(_eof_without_message, 2, timeout=60)
    first = str(info.value).splitlines()[0]
    assert first == ("rank 1 of 2 failed with EOFError (it carries no message; the traceback "
                     "below shows where it was raised); the process exited with code 1")
    assert "raise EOFError()" in info.value.remote_traceback


def _killed():
    if dist.get_rank() == 1:
        print("rank 1: step 3 done", flush=True)
        print("rank 1: about to be killed", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def _exits_3():
    if dist.get_rank() == 1:
        print("rank 1: step 3 done", flush=True)
        print("rank 1: leaving with status 3", file=sys.stderr, flush=True)
        os._exit(3)
    time.sleep(60)


@pytest.mark.parametrize("fn, how, said", [
    (_killed, "was killed by signal 9 (SIGKILL)", "rank 1: about to be killed"),
    (_exits_3, "exited with code 3", "rank 1: leaving with status 3")])
def test_a_rank_that_dies_without_a_traceback_shows_its_exit_and_last_lines(fn, how, said):
    with pytest.raises(RankError) as info:
        run(fn, 2, timeout=60)
    text = str(info.value)
    assert text.splitlines()[0] == (f"rank 1 of 2 failed with ProcessDied: the process {how} "
                                    "before returning")
    last = text.split("--- the last lines rank 1 wrote (stdout and stderr) ---\n")[1]
    assert last.splitlines()[:2] == ["rank 1: step 3 done", said]


def _die_leaving_a_daemon(folder):
    """Fork a process in a session of its own (out of reach of the kill of the rank's group),
    which keeps every pipe of the rank open; then end at once with status 3."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        time.sleep(120)
        os._exit(0)
    with open(os.path.join(folder, f"daemon-{dist.get_rank()}"), "w") as f:
        f.write(str(pid))
    print(f"rank {dist.get_rank()} leaves", flush=True)
    os._exit(3)


def _nothing():
    return None


def test_a_run_whose_ranks_are_all_gone_ends_at_once_naming_them(tmp_path):
    timeout = 90
    run(_nothing, 2)  # the server is started and warm: what is timed below is the run alone
    t0 = time.monotonic()
    try:
        with pytest.raises(RankError) as info:
            run(_die_leaving_a_daemon, 2, str(tmp_path), timeout=timeout)
    finally:
        for path in tmp_path.glob("daemon-*"):
            try:
                os.kill(int(path.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    took = time.monotonic() - t0
    assert took < timeout / 3, took  # before the fix: the whole timeout, then a TimeoutError
    text = str(info.value)
    failed = info.value.rank
    other = 1 - failed
    assert text.splitlines()[0] == (f"rank {failed} of 2 failed with ProcessDied: the process "
                                    "exited with code 3 before returning")
    assert text.splitlines()[-1] == f"--- rank {other} exited with code 3 ---", text
