"""course_lib.run: results, errors, timeouts, interrupts, cleanup, concurrency, bad input."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types

import psutil
import pytest
import torch
import torch.distributed as dist

from course_lib import devices
from course_lib.launcher import launch
from course_lib.launcher._warm import preimports_of
from course_lib.launcher.launch import RankError, RunReport, run
from processes import rank_processes, wait_gone

_HERE = os.path.dirname(os.path.abspath(__file__))
_PATH = os.pathsep.join([_HERE, os.path.dirname(_HERE), os.path.dirname(os.path.dirname(_HERE))])

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def _all_reduce_rank(scale: float = 1.0, *, offset: float = 0.0):
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item() * scale + offset, os.environ["RANK"]


def test_results_come_back_in_rank_order_with_args_and_kwargs():
    report = RunReport()
    out = run(_all_reduce_rank, 4, 2.0, offset=1.0, report=report)
    assert out == [(r, 4, 6.0 * 2.0 + 1.0, str(r)) for r in range(4)]
    assert report.exit_statuses == [0, 0, 0, 0]  # released together, ended with os._exit(0)
    for phases in [report.phases, *report.rank_phases]:  # a timeline: moments in order
        assert [t for _, t in phases] == sorted(t for _, t in phases)
    assert [name for name, _ in report.phases][-2:] == ["results in", "ranks ended"]
    assert len(report.rank_phases) == 4 and report.rank_phases[3][-1][0] == "result pickled"


def _environment():
    return os.environ.get("COURSE_LIB_TEST_NEW"), "GLIBC_TUNABLES" in os.environ, os.getcwd()


def test_single_rank_works_and_sees_the_callers_environment(monkeypatch, tmp_path):
    run(_all_reduce_rank, 1)  # the server is running before the environment changes
    monkeypatch.setenv("COURSE_LIB_TEST_NEW", "yes")
    monkeypatch.chdir(tmp_path)
    # the server's own malloc tunable must not leak into the rank's environment
    assert run(_environment, 1) == [("yes", "GLIBC_TUNABLES" in os.environ, str(tmp_path))]
    assert run(_all_reduce_rank, 1) == [(0, 1, 0.0, "0")]


def test_function_defined_in_a_notebook_cell_is_shipped_by_value():
    # What IPython does: compile a cell under a file name that does not exist on disk, into
    # __main__-like globals. Ranks must still run it (and show its source lines on errors).
    cell = textwrap.dedent("""
        import torch.distributed as dist
        FACTOR = 10
        def cell_fn(x):
            if x < 0:
                raise ValueError("negative input from the cell")
            return dist.get_rank() * FACTOR + x
    """)
    module = types.ModuleType("__main__")
    exec(compile(cell, "/tmp/ipykernel_0/123456.py", "exec"), module.__dict__)
    import linecache
    linecache.cache["/tmp/ipykernel_0/123456.py"] = (len(cell), None, cell.splitlines(True),
                                                     "/tmp/ipykernel_0/123456.py")
    assert run(module.cell_fn, 3, 5) == [5, 15, 25]
    with pytest.raises(RankError) as info:
        run(module.cell_fn, 2, -1)
    assert 'raise ValueError("negative input from the cell")' in str(info.value)


def test_closures_and_lambdas_work():
    base = torch.arange(3.0)
    assert run(lambda: (base * dist.get_rank()).tolist(), 2) == [[0.0, 0.0, 0.0], [0.0, 1.0, 2.0]]


def _fail_on_rank_two():
    if dist.get_rank() == 2:
        raise KeyError("the data shard is missing")
    dist.barrier()  # the others wait for rank 2, which never comes


def test_a_raising_rank_names_itself_with_its_traceback_and_stops_the_others():
    t0 = time.monotonic()
    report = RunReport()
    with pytest.raises(RankError) as info:
        run(_fail_on_rank_two, 4, timeout=600, report=report)
    err = info.value
    # rank 2 ended with status 1 after reporting. The others were in barrier: killed (SIGKILL),
    # unless gloo noticed rank 2's closed connection first and they failed on their own (1)
    statuses = report.exit_statuses
    assert statuses[2] == 1 and all(s in (-signal.SIGKILL, 1) for s in statuses), statuses
    assert err.rank == 2 and err.exc_type == "KeyError"
    assert "rank 2 of 4 failed with KeyError" in str(err)
    assert "in _fail_on_rank_two" in err.remote_traceback
    assert 'raise KeyError("the data shard is missing")' in err.remote_traceback
    assert time.monotonic() - t0 < 300  # did not wait for the timeout (margin for load 8)


def _die_hard():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def test_a_rank_killed_by_a_signal_is_reported():
    with pytest.raises(RankError, match=r"rank 1 of 3 failed with ProcessDied: .*signal 9 \(SIGKILL\)"):
        run(_die_hard, 3)


def _hang_in_collective():
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never joins
    else:
        time.sleep(600)


def test_a_hung_collective_times_out_with_a_clear_error():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not finish within 2 s; a collective may be waiting"):
        run(_hang_in_collective, 2, timeout=2)
    assert time.monotonic() - t0 < 300  # stopped, not waited for the 600 s sleep


def _print_things():
    print(f"hello from {dist.get_rank()}")
    print(f"to stderr {dist.get_rank()}", file=sys.stderr)
    sys.stdout.write("no newline at the end")
    return None


def test_output_is_streamed_with_rank_prefixes(capsys):
    assert run(_print_things, 2) == [None, None]
    out, err = capsys.readouterr()
    for r in range(2):
        assert f"[rank {r}] hello from {r}\n" in out
        assert f"[rank {r}] no newline at the end\n" in out
        assert f"[rank {r}] to stderr {r}\n" in err


def test_unpicklable_results_are_reported():
    with pytest.raises(RankError, match="return value of rank 0 cannot be pickled"):
        run(lambda: threading.Lock(), 1)


def _sleep_and_report_pid(path):
    with open(f"{path}.{dist.get_rank()}", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)


def _pids(path, n, timeout=120.0):  # a fresh server imports torch first
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            return [int(open(f"{path}.{r}").read()) for r in range(n)]
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
    raise AssertionError("ranks did not start")


def test_keyboard_interrupt_kills_every_rank_and_run_stays_usable(tmp_path):
    path = str(tmp_path / "pid")
    pids = []

    def interrupt_when_started():
        pids.extend(_pids(path, 3))
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run(_sleep_and_report_pid, 3, path)
    assert len(pids) == 3 and wait_gone(pids) == []
    assert [r[0] for r in run(_all_reduce_rank, 2)] == [0, 1]  # the "kernel" still works


def test_a_killed_parent_takes_its_ranks_and_server_with_it(tmp_path):
    path = str(tmp_path / "pid")
    script = f"from course_lib.launcher.launch import run\nfrom test_launch import _sleep_and_report_pid\n" \
             f"run(_sleep_and_report_pid, 3, {path!r})\n"
    env = {**os.environ, "PYTHONPATH": _PATH}
    # this folder, tests/ and the repository on the path: the test module, its helpers and
    # course_lib import as they do under pytest
    parent = subprocess.Popen([sys.executable, "-c", script], env=env,
                              cwd=os.path.dirname(__file__))
    try:
        pids = _pids(path, 3)
        server = [p.pid for p in psutil.Process(parent.pid).children()]
    finally:
        parent.kill()
        parent.wait()
    assert wait_gone(pids + server) == []


def test_two_concurrent_launches_do_not_collide():
    script = ("from course_lib.launcher.launch import run\nfrom test_launch import _all_reduce_rank\n"
              "for _ in range(5):\n    assert run(_all_reduce_rank, 3)[2][2] == 3.0\nprint('ok')\n")
    env = {**os.environ, "PYTHONPATH": _PATH}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              text=True, cwd=os.path.dirname(__file__)) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]  # two fresh imports of torch: >120 s at load 8+
    assert [p.returncode for p in procs] == [0, 0] and all("ok" in o for o in outs)


def test_concurrent_launches_from_threads_of_one_kernel():
    results = {}

    def go(i):
        results[i] = run(_all_reduce_rank, 2, float(i))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {i: [r[2] for r in res] for i, res in results.items()} == {0: [0.0, 0.0], 1: [1.0, 1.0],
                                                                    2: [2.0, 2.0]}


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(nprocs=0), ValueError, "nprocs must be at least 1, got 0"),
    (dict(nprocs=-3), ValueError, "nprocs must be at least 1"),
    (dict(nprocs=10_000), ValueError, "nprocs=10000 is more than this machine allows"),
    (dict(nprocs=2.0), TypeError, "nprocs must be an int"),
    (dict(nprocs=2, backend="mpi"), ValueError, "unknown backend 'mpi'"),
    (dict(nprocs=2, device="tpu"), ValueError, "unknown device 'tpu'"),
    (dict(nprocs=2, timeout=0), ValueError, "timeout must be a positive number"),
    (dict(nprocs=2, threads=0), ValueError, "threads must be at least 1"),
    (dict(nprocs=2, timeout=float("nan")), ValueError, "timeout must be a positive number of "
                                                       "seconds, finite, got nan"),
    (dict(nprocs=2, timeout=float("inf")), ValueError, "finite, got inf"),
    (dict(nprocs=2, timeout=True), ValueError, "finite, got True"),
    (dict(nprocs=2, threads="2"), TypeError, "threads must be an int or None, got '2'"),
    (dict(nprocs=2, threads=1.5), TypeError, "threads must be an int or None, got 1.5"),
    # sane maxima: these passed the check and failed inside every rank (or tried 10**9 threads)
    (dict(nprocs=2, timeout=1e15), ValueError, r"timeout must be at most 604800 s \(a week\), "
                                                r"got 1000000000000000\.0"),
    (dict(nprocs=2, timeout=604801), ValueError, "timeout must be at most 604800 s"),
    (dict(nprocs=2, threads=10**9), ValueError, rf"threads must be at most {devices.cpu_count()}, "
                                                "the cores this process may use, got 1000000000"),
    (dict(nprocs=2, threads=devices.cpu_count() + 1), ValueError, "threads must be at most"),
])
def test_bad_input_fails_before_any_process_starts(monkeypatch, kwargs, error, message):
    def no_server():
        raise AssertionError("a process was about to start")
    monkeypatch.setattr(launch._SERVERS, "get", no_server)
    with pytest.raises(error, match=message):
        run(_all_reduce_rank, **kwargs)


@pytest.mark.skipif(devices.gpu_count() > 0, reason="this machine has a GPU")
@pytest.mark.parametrize("kwargs", [dict(device="cuda"), dict(backend="nccl")])
def test_cuda_without_gpus_is_refused_before_starting(monkeypatch, kwargs):
    monkeypatch.setattr(launch._SERVERS, "get", lambda: pytest.fail("started a process"))
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        run(_all_reduce_rank, 2, **kwargs)


def test_not_callable_and_unshippable_arguments_are_refused(monkeypatch):
    monkeypatch.setattr(launch._SERVERS, "get", lambda: pytest.fail("started a process"))
    with pytest.raises(TypeError, match="fn must be callable"):
        run("train.py", 2)
    with pytest.raises(TypeError, match="cannot ship"):
        run(_all_reduce_rank, 2, threading.Lock())


def test_fifty_calls_in_a_row_leak_no_processes_or_file_descriptors():
    run(_all_reduce_rank, 2)
    fds_before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for _ in range(50):
        assert run(_all_reduce_rank, 2)[1][2] == 1.0
    if fds_before is not None:
        assert len(os.listdir("/proc/self/fd")) == fds_before
    assert wait_gone([p.pid for p in rank_processes()]) == []


def test_threads_per_rank_follow_the_core_count():
    expected = max(1, devices.cpu_count() // 2)
    assert run(torch.get_num_threads, 2) == [expected, expected]
    assert run(torch.get_num_threads, 2, threads=1) == [1, 1]


def _has_mailbox():
    return "mailbox" in sys.modules


_has_mailbox.preimport = ("mailbox",)   # a module torch never imports


def test_warm_up_without_waiting_and_a_functions_preimport_attribute(tmp_path):
    """``warm_up(wait=False)`` starts the server and returns; the first run waits for it. A rank
    function's ``preimport`` names modules the server imports before forking: the ranks have
    them, this process does not."""
    here = os.path.dirname(os.path.abspath(__file__))   # this checkout's course_lib, then tests
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(here)), here,
                                                        os.path.dirname(here)])}
    script = ("import sys\nfrom course_lib.launcher import launch\n"
              "launch.warm_up(wait=False)\nassert launch._SERVERS._server.alive()\n"
              "from test_launch import _has_mailbox\n"
              "print(launch.run(_has_mailbox, 2), 'mailbox' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=here, check=True,
                         timeout=300, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "[True, True] False"
    assert preimports_of(_has_mailbox) == ("test_launch", "mailbox")


def test_run_folders_of_killed_kernels_are_removed_by_the_next_kernel(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))  # this checkout's course_lib, then tests
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(here), here]),
           "TMPDIR": str(tmp_path)}
    path = str(tmp_path / "pid")
    script = f"from course_lib.launcher.launch import run\nfrom test_launch import _sleep_and_report_pid\n" \
             f"run(_sleep_and_report_pid, 2, {path!r})\n"
    killed = subprocess.Popen([sys.executable, "-c", script], env=env,
                              cwd=here)
    try:
        wait_gone(_pids(path, 2), timeout=0)
    finally:
        killed.kill()  # like a kernel killed mid-run: its run folder stays
        killed.wait()
    assert [p for p in os.listdir(tmp_path) if p.startswith(f"course_lib_run_{killed.pid}_")]
    subprocess.run([sys.executable, "-c", "from course_lib.launcher.launch import warm_up; warm_up()"],
                   env=env, check=True, timeout=300)
    assert [p for p in os.listdir(tmp_path) if p.startswith("course_lib_run_")] == []
