"""What every rank started by :func:`course_lib.run` executes (the child side of the launcher).

This module is preloaded into the warm fork server together with torch, so a rank only forks,
wires up its pipes, joins the process group and calls the shipped function. The steps, in order:

1. a *lifeline* thread: when the launching process dies (kernel killed, crash), the pipe it held
   closes and this rank kills itself — no orphans, whatever happens to the parent;
2. stdout/stderr (Python and C level) go to pipes the parent reads and prefixes with the rank;
3. ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` are set as torchrun would, threads per rank are capped;
4. ``init_process_group`` through a file store in a private directory (no port, no DNS look-up;
   gloo's own sockets bound to the loopback interface);
5. the function runs; its result or its traceback goes back through a result pipe;
6. the rank ends with ``os._exit`` — interpreter shutdown with live gloo threads aborts the
   process in 10-30 % of runs (SIGABRT, "terminate called without an active exception").
"""
from __future__ import annotations

import faulthandler
import io
import linecache
import os
import pickle
import signal
import sys
import threading
import traceback
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist

from course_lib.devices import loopback_interface


def _watch_lifeline(fd: int) -> None:
    """Block until the parent's end of the lifeline closes, then end this rank at once."""
    try:
        os.read(fd, 1)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _redirect(pipe_fd: int, fd: int) -> io.TextIOWrapper:
    """Point file descriptor ``fd`` at a pipe; return a line-buffered text stream on it."""
    os.dup2(pipe_fd, fd)
    os.close(pipe_fd)
    return io.TextIOWrapper(os.fdopen(fd, "wb", buffering=0, closefd=False),
                            encoding="utf-8", errors="replace", line_buffering=True)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - nothing useful to do about a broken pipe here
            pass


def main(job: tuple, fds: list[int]) -> None:
    """Entry point of one rank, in a process just forked from the warm server.

    ``job`` is ``(rank, placement, store_path, timeout_s, payload, context)``; ``fds`` are the
    write ends of stdout, stderr and result pipes and the read end of the lifeline. ``context``
    carries the launching process's ``sys.path``, working directory and environment, so a rank
    sees what a freshly started process of the notebook would see (e.g. the notebook's own
    modules), although the server was started earlier.
    """
    rank, placement, store_path, timeout_s, payload, context = job
    out_fd, err_fd, result_fd, lifeline_fd = fds
    threading.Thread(target=_watch_lifeline, args=(lifeline_fd,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles interrupts and kills us
    sys.stdout = _redirect(out_fd, 1)
    sys.stderr = _redirect(err_fd, 2)
    faulthandler.enable(file=sys.stderr)
    status, message = 0, None
    try:
        sys.path[:] = context["sys_path"]
        os.chdir(context["cwd"])
        os.environ.clear()
        os.environ.update(context["environ"])
        world = placement.nprocs
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0",
                          GLOO_SOCKET_IFNAME=loopback_interface())
        torch.set_num_threads(placement.threads)
        device = placement.device_of(rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.FileStore(store_path, world)
        dist.init_process_group(placement.backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s),
                                device_id=device if placement.backend == "nccl" else None)
        fn, args, kwargs, sources = cloudpickle.loads(payload)
        for filename, lines in sources.items():  # so tracebacks show notebook-cell lines
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
        value = fn(*args, **kwargs)
        try:
            message = ("ok", cloudpickle.dumps(value))
        except Exception as exc:  # noqa: BLE001 - report what could not be shipped back
            raise TypeError(f"the return value of rank {rank} cannot be pickled: {exc}") from exc
        if dist.is_initialized():
            dist.barrier()  # nobody leaves while a peer may still talk to it
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the notebook
        status = 1
        tb = exc.__traceback__.tb_next or exc.__traceback__  # skip this frame
        message = ("error", type(exc).__name__, str(exc),
                   "".join(traceback.format_exception(type(exc), exc, tb)))
    finally:
        _flush()
        try:
            with os.fdopen(result_fd, "wb") as result:
                result.write(pickle.dumps(message))
        except Exception:  # noqa: BLE001 - parent gone: nothing left to tell
            pass
        os._exit(status)
