"""Big results and endless lines: read in linear time, and never hide the real error."""
from __future__ import annotations

import io
import os
import selectors
import signal
import tempfile
import threading
import time

import pytest
import torch.distributed as dist

from course_lib.launcher import _rank_pipes
from course_lib.launcher.launch import RankError, run

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")
MB = 1 << 20


def _bytes_of_rank(n):
    return bytes([dist.get_rank()]) * n


def test_a_100_mb_result_per_rank_comes_back_whole():
    out = run(_bytes_of_rank, 2, 100 * MB, timeout=300)
    assert [len(r) for r in out] == [100 * MB] * 2 and [r[-1] for r in out] == [0, 1]


def test_pipes_collect_into_one_growing_buffer():
    # linear time: each chunk is appended in place, never copied with everything before it
    r, w = os.pipe()
    state = _rank_pipes.Rank(0, 0, {})
    sel = selectors.DefaultSelector()
    sel.register(r, selectors.EVENT_READ)
    buffers = set()
    for name in ("result", "out"):
        for _ in range(20):
            os.write(w, b"y" * 1000)
            assert _rank_pipes.pump(state, name, r, sel)
            buffers.add(id(state.partial[name]))
        assert len(state.partial[name]) == 20_000 and len(buffers) == (1 if name == "result" else 2)
    sel.close()
    os.close(w)
    os.close(r)


def _long_line(n):
    os.write(1, b"y" * n)
    return 0


def test_a_50_mb_line_without_newline_arrives_whole(capfd):
    assert run(_long_line, 1, 50 * MB, timeout=300) == [0]
    out = capfd.readouterr().out
    assert out.startswith("[rank 0] yyy") and out.count("y") == 50 * MB


def _stall_half_way_through_the_result(fail_rank=None):
    """Rank 0 returns 50 MB but stops after sending half of it; ``fail_rank`` raises later."""
    if dist.get_rank() == fail_rank:
        time.sleep(2)
        raise ValueError("rank 1 gives up")

    class HalfWriter(io.RawIOBase):
        def __init__(self, fd, mode):
            self.fd = fd

        def write(self, data):
            view = memoryview(data)[: len(data) // 2]
            while view:
                view = view[os.write(self.fd, view):]
            time.sleep(600)

    os.fdopen = HalfWriter  # this rank's own copy of os: how its result goes back
    return b"z" * (50 * MB)


def _fds_and_run_dirs(tmp):
    return sorted(os.listdir("/proc/self/fd")), sorted(os.listdir(tmp))


@pytest.fixture
def private_tmp(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run(_bytes_of_rank, 1, 1)  # the server and its pipes exist before counting
    before = _fds_and_run_dirs(tmp_path)
    yield
    assert _fds_and_run_dirs(tmp_path) == before  # nothing leaked: descriptors, run folders


@pytest.mark.usefixtures("private_tmp")
def test_a_timeout_while_a_result_is_in_flight_is_a_timeout():
    with pytest.raises(TimeoutError, match="did not finish within 4 s"):
        run(_stall_half_way_through_the_result, 2, timeout=4)


@pytest.mark.usefixtures("private_tmp")
def test_another_rank_failing_while_a_result_is_in_flight_is_named():
    with pytest.raises(RankError, match="rank 1 of 2 failed with ValueError: rank 1 gives up"):
        run(_stall_half_way_through_the_result, 2, 1, timeout=120)


@pytest.mark.usefixtures("private_tmp")
def test_stop_while_a_result_is_in_flight_is_a_keyboard_interrupt():
    threading.Timer(4, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        run(_stall_half_way_through_the_result, 2, timeout=120)
