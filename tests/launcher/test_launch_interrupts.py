"""Stop (SIGINT) at any moment of a launch: the warm server stays in step, no rank survives."""
from __future__ import annotations

import os
import random
import select
import signal
import socket
import threading
import time
import traceback

import psutil
import pytest
import torch.distributed as dist

from course_lib.launcher import _warm, launch
from course_lib.launcher.launch import run
from processes import wait_gone

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def _pid_and_rank():
    return os.getpid(), dist.get_rank()


def _unread_bytes(server) -> int:
    if not select.select([server.sock], [], [], 0)[0]:
        return 0
    return len(server.sock.recv(1 << 16, socket.MSG_PEEK))


def _live_ranks(server) -> list[int]:
    kids = psutil.Process(server.proc.pid).children(recursive=True)
    return wait_gone([k.pid for k in kids], timeout=10)


def _forks_recorded(monkeypatch) -> list:
    """Record the pids the warm server hands back, launch by launch."""
    forks, original = [], _warm.WarmServer.fork

    def fork(self, *args, **kwargs):
        pids = original(self, *args, **kwargs)
        forks.append(pids)
        return pids
    monkeypatch.setattr(_warm.WarmServer, "fork", fork)
    return forks


def test_stop_between_sending_jobs_and_reading_pids_keeps_the_server_in_step(monkeypatch):
    run(_pid_and_rank, 2)
    server = launch._SERVERS.get()
    forks = _forks_recorded(monkeypatch)
    calls, original = [], _warm._recv_exact

    def stop_while_reading(sock, n):  # Stop pressed after the jobs went out, before any pid came
        if not calls:
            signal.raise_signal(signal.SIGINT)
        calls.append(n)
        return original(sock, n)
    monkeypatch.setattr(_warm, "_recv_exact", stop_while_reading)
    with pytest.raises(KeyboardInterrupt):
        run(_pid_and_rank, 4)
    monkeypatch.setattr(_warm, "_recv_exact", original)
    assert wait_gone(forks[0]) == [], "ranks of the stopped launch are still running"
    out = run(_pid_and_rank, 3)
    assert [rank for _, rank in out] == [0, 1, 2]
    assert [pid for pid, _ in out] == forks[-1]  # each rank matched to its own pid
    assert launch._SERVERS.get() is server and _unread_bytes(server) == 0


def _settle(timer: threading.Timer) -> None:
    """Wait for the timer; a Stop that lands after ``run`` returned (an idle machine launches in
    well under 0.1 s) interrupts this wait instead of the test, and must not reach the next run."""
    while True:
        try:
            timer.join()
            time.sleep(0.02)
            return
        except KeyboardInterrupt:
            continue


def test_thirty_stops_at_random_moments_then_twenty_right_runs():
    run(_pid_and_rank, 2)
    server = launch._SERVERS.get()
    rng = random.Random(19)
    for _ in range(30):
        timer = threading.Timer(rng.uniform(0.0, 0.1), os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            run(_pid_and_rank, 4)
        except KeyboardInterrupt:
            pass
        _settle(timer)
    results = [run(_pid_and_rank, 4, timeout=60) for _ in range(20)]
    assert all([rank for _, rank in out] == [0, 1, 2, 3] for out in results)
    assert launch._SERVERS.get() is server, "the warm server had to be replaced"
    assert _unread_bytes(server) == 0
    assert _live_ranks(server) == []


def _sleep():
    time.sleep(60)


def test_stop_raises_one_line_and_keeps_where_it_arrived():
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt) as info:
        run(_sleep, 2)
    err = info.value
    assert str(err) == "run on 2 rank(s) stopped; every rank was ended"
    frames = traceback.extract_tb(err.__traceback__)
    assert [f.name for f in frames][-1] == "run" and len(frames) <= 2  # no launcher internals
    assert err.__suppress_context__ and isinstance(err.__context__, KeyboardInterrupt)
    inner = [f.name for f in traceback.extract_tb(err.__context__.__traceback__)]
    assert "_supervise" in inner  # the details stay reachable
