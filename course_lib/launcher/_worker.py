"""What every rank started by :func:`course_lib.run` executes (the child side of the launcher).

Preloaded into the warm fork server with torch, so a rank only forks, wires up its pipes, joins
the process group and calls the shipped function. In order: (1) a *lifeline* thread kills the
rank's process group when the launching process dies (its pipe closes): no orphans; (2) stdout
and stderr (Python and C level) go to pipes the parent prefixes with the rank; (3) ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` are set as torchrun would, threads per rank capped; (4)
``init_process_group`` through a file store in a private directory, gloo bound to loopback;
(5) the function runs; its output pipes close, then its result or traceback goes back through
a result pipe; (6) a rank that succeeded waits until the parent has *every* rank's result, is
released through the lifeline and ends with ``os._exit``; a rank that failed ends at once.
Why ``os._exit`` and the parent barrier: docs/modules/launcher.md (_worker.py).
"""
from __future__ import annotations

import contextlib
import faulthandler
import io
import linecache
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist

from course_lib.launcher import _diagnose, _results
from course_lib.launcher.devices import loopback_interface


def _watch_lifeline(fd: int, answered: threading.Event) -> None:
    """Block until the parent writes to the lifeline or its end closes; then end this rank.

    The parent writes one byte per rank when every rank answered (a clean exit, status 0); the
    lifeline closes when it stops the run or dies (SIGKILL, so that nothing of an unfinished
    rank survives).
    """
    with contextlib.suppress(OSError):
        os.read(fd, 1)
    if answered.is_set():
        os._exit(0)
    if os.getpgid(0) == os.getpid():  # this rank leads its group: it and whatever it started
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _redirect(pipe_fd: int, fd: int) -> io.TextIOWrapper:
    """Point file descriptor ``fd`` at a pipe; return a line-buffered text stream on it."""
    os.dup2(pipe_fd, fd)
    os.close(pipe_fd)
    return io.TextIOWrapper(os.fdopen(fd, "wb", buffering=0, closefd=False),
                            encoding="utf-8", errors="replace", line_buffering=True)


def _flush_and_close_output() -> None:
    """Flush stdout/stderr, then point fds 1 and 2 at /dev/null: the parent sees end-of-file."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a broken pipe: nothing useful to do about it here
            stream.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def main(job: tuple, fds: list[int]) -> None:
    """Entry point of one rank, in a process just forked from the warm server.

    ``job`` is ``(rank, placement, store_path, timeout_s, payload, context)``; ``fds`` are the
    write ends of stdout, stderr and result pipes and the read end of the lifeline. ``context``
    carries the launching process's ``sys.path``, working directory and environment, so a rank
    sees what a freshly started process of the notebook would see (e.g. the notebook's own
    modules), although the server was started earlier.
    """
    rank, placement, store_path, timeout_s, payload, context = job
    stamps = [("rank started", time.monotonic())]
    out_fd, err_fd, result_fd, lifeline_fd = fds
    for fd in (result_fd, lifeline_fd):  # not for a program the rank runs (stdout/err are)
        os.set_inheritable(fd, False)
    answered = threading.Event()
    watcher = threading.Thread(target=_watch_lifeline, args=(lifeline_fd, answered), daemon=True)
    watcher.start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles interrupts and kills us
    sys.stdout = _redirect(out_fd, 1)
    sys.stderr = _redirect(err_fd, 2)
    faulthandler.enable(file=sys.stderr)
    stack_dump = _diagnose.arm_stack_dump(os.path.dirname(store_path), rank)  # noqa: F841
    status, message, value_pickle = 0, None, b""
    try:
        sys.path[:] = context["sys_path"]
        os.chdir(context["cwd"])
        world = placement.nprocs
        os.environ.clear()  # the server's own variables (e.g. tunables) go, the notebook's come
        os.environ.update(context["environ"], RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0",
                          GLOO_SOCKET_IFNAME=loopback_interface())
        torch.set_num_threads(placement.threads)
        device = placement.device_of(rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _diagnose.apply_debug(context.get("debug"))
        stamps.append(("rank set up", time.monotonic()))
        store = dist.FileStore(store_path, world)
        dist.init_process_group(placement.backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s),
                                device_id=device if placement.backend == "nccl" else None)
        stamps.append(("process group", time.monotonic()))
        fn, args, kwargs, sources = cloudpickle.loads(payload)
        for filename, lines in sources.items():  # so tracebacks show notebook-cell lines
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
        stamps.append(("fn unpickled", time.monotonic()))
        value = fn(*args, **kwargs)
        stamps.append(("fn ran", time.monotonic()))
        try:
            message, value_pickle = ("ok",), _results.dumps(value)
        except Exception as exc:  # noqa: BLE001 - report what could not be shipped back
            raise TypeError(f"the return value of rank {rank} cannot be pickled: {exc}") from exc
        stamps.append(("result pickled", time.monotonic()))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the notebook
        status = 1
        tb = exc.__traceback__.tb_next or exc.__traceback__  # skip this frame
        message = ("error", type(exc).__name__, str(exc),
                   "".join(traceback.format_exception(type(exc), exc, tb)))
    finally:
        _flush_and_close_output()
        if status == 0:
            answered.set()
        with contextlib.suppress(Exception), os.fdopen(result_fd, "wb") as result:
            result.writelines(_results.message((message, stamps), value_pickle))  # (parent gone:
            # nothing left to tell)
        if status == 0:
            watcher.join()  # until every rank answered: the watcher then ends this process
        os._exit(status)
