"""run's diagnosis on real ranks: debug="detail" names a mismatch, a hang shows each rank's stack,
a rank that died in a collective is summarised in one line; bad debug values fail up front."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from course_lib.launcher import _diagnose, launch
from course_lib.launcher.launch import RankError, run, warm_up

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


@pytest.fixture(scope="module", autouse=True)
def _warm():
    warm_up()  # the server's start is not what the 10-second bound is about


def _shapes_differ():
    t = torch.ones(6 if dist.get_rank() == 0 else 4)
    dist.all_reduce(t)
    return t.sum().item()


def _rank_one_never_arrives():
    if dist.get_rank() == 1:
        time.sleep(60)
    dist.barrier()


def test_detail_names_the_mismatch_within_ten_seconds():
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(_shapes_differ, 2, debug="detail", timeout=30)
    assert time.monotonic() - start < 10
    first = str(info.value).splitlines()[0]
    assert first.startswith("collective mismatch (found by debug='detail')"), first
    assert first.endswith("rank 0 runs ALLREDUCE of shape [6] (Float) while rank 1 runs "
                          "ALLREDUCE of shape [4] (Float)"), first
    assert info.value.exc_type == "RuntimeError" and info.value.summary == first


def test_without_debug_the_abort_is_summarised_in_one_line():
    with pytest.raises(RankError) as info:
        run(_shapes_differ, 2, timeout=30)
    first = str(info.value).splitlines()[0]
    assert "died in a collective: it received" in first and "bytes where" in first, first
    assert info.value.exc_type == "ProcessDied"
    assert "Received data size doesn't match expected size" in str(info.value)  # the raw dump


def test_a_hang_shows_where_each_unfinished_rank_waits():
    with pytest.raises(TimeoutError) as info:
        run(_rank_one_never_arrives, 2, timeout=3)
    text = str(info.value)
    assert text.startswith("rank(s) [0, 1] of 2 did not finish within 3 s")
    rank0 = text.split("--- where rank 0 was")[1].split("--- where rank 1 was")[0]
    rank1 = text.split("--- where rank 1 was")[1]
    assert "in barrier" in rank0 and "in _rank_one_never_arrives" in rank0, rank0
    assert "time.sleep(60)" in rank1 and "in _rank_one_never_arrives" in rank1, rank1
    assert "_worker.py" not in text and "_watch_lifeline" not in text  # the launcher's own frames


def _rank_one_dies_late_to_be_seen():
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        if os.fork() == 0:  # a child holds rank 1's pipes, not its sockets, a moment longer:
            for fd in os.listdir("/proc/self/fd"):  # rank 0 sees the reset before the death
                try:
                    if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                        os.close(int(fd))
                except OSError:
                    pass
            time.sleep(0.4)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)  # rank 0: "Connection reset by peer", reported before rank 1's death


def test_the_rank_that_died_is_blamed_not_the_peer_that_lost_it():
    with pytest.raises(RankError) as info:
        run(_rank_one_dies_late_to_be_seen, 2, timeout=30)
    assert (info.value.rank, info.value.exc_type) == (1, "ProcessDied"), str(info.value)
    assert "signal 9" in str(info.value)


@pytest.mark.parametrize("bad", ["DETAIL!", "verbose", 1, True])
def test_a_bad_debug_level_fails_before_any_process_starts(bad, monkeypatch):
    monkeypatch.setattr(launch, "_launch", lambda *a, **k: pytest.fail("ranks were started"))
    with pytest.raises(ValueError, match="debug must be None or one of"):
        run(_shapes_differ, 2, debug=bad)


def test_format_stack_keeps_the_user_thread_and_cuts_the_launcher():
    raw = ('Thread 0x1 (most recent call first):\n'
           f'  File "{_diagnose._LAUNCHER}/_worker.py", line 51 in _watch_lifeline\n\n'
           'Current thread 0x2 (most recent call first):\n'
           '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 1 in barrier\n'
           '  File "/nb/cell.py", line 3 in step\n'
           f'  File "{_diagnose._LAUNCHER}/_worker.py", line 130 in main\n')
    assert _diagnose.format_stack(raw) == (
        '  File "torch/distributed/distributed_c10d.py", line 1, in barrier\n'
        '  File "/nb/cell.py", line 3, in step')
