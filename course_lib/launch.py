"""``run``: a function typed in a notebook cell, executed on N real processes.

Why not ``torch.multiprocessing.spawn``? It cannot start a function defined in a notebook cell
(the child looks it up in ``__main__`` and fails), and ``torchrun`` costs seconds per launch on a
laptop because every rank imports torch again. Here:

* ranks are forked from a **warm fork server** (``multiprocessing``'s forkserver with torch
  preloaded), so a 4-rank launch costs tens of milliseconds after the first one;
* the function is shipped **by value** with cloudpickle, so cell-defined functions work;
* rendezvous uses a **file store** in a private temporary directory: no port to collide with
  another notebook, no host-name look-up (a TCP store stalled 5 s in 1 run of 10 here);
* each rank's stdout/stderr is streamed live into the cell, prefixed ``[rank r]``;
* a failing rank, a timeout or an interrupt ends *every* rank; a dying parent takes its ranks
  with it through a lifeline pipe (see :mod:`course_lib._worker`).

Chapter 00 introduces it; every later chapter runs its experiments with it. For scripts and
multi-node command lines, see :mod:`course_lib.torchrun`.
"""
from __future__ import annotations

import linecache
import os
import pickle
import selectors
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import cloudpickle

from course_lib import devices
from course_lib._warm import WarmServer

__all__ = ["run", "RankError", "warm_up"]


class RankError(RuntimeError):
    """A rank failed. ``rank``, ``exc_type`` and ``remote_traceback`` tell which and why."""

    def __init__(self, rank: int, nprocs: int, exc_type: str, message: str, remote_traceback: str):
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback
        super().__init__(f"rank {rank} of {nprocs} failed with {exc_type}: {message}\n"
                         f"\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}\n"
                         f"--- the other ranks were stopped ---")


class _ServerCache:
    """The one warm server of this process, started on first use (restarted if it died)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: WarmServer | None = None

    def get(self) -> WarmServer:
        with self._lock:
            if self._server is None or not self._server.alive():
                self._server = WarmServer.start()
            return self._server


_SERVERS = _ServerCache()  # per-process cache of a process handle, not course state


def warm_up() -> None:
    """Start the warm server now (it imports torch once, ~1-2 s), so the first run is fast."""
    _SERVERS.get()


@dataclass
class _Rank:
    """The parent's handle on one rank: its pid, pipes and what it has said."""

    rank: int
    pid: int
    fds: dict  # name -> read end: "out", "err", "result", "exit"
    partial: dict = field(default_factory=lambda: {"out": b"", "err": b"", "result": b""})
    outcome: tuple | None = None
    exitcode: int | None = None

    def kill(self) -> None:
        if self.exitcode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _emit(line: bytes, rank: int, stream: TextIO) -> None:
    stream.write(f"[rank {rank}] {line.decode('utf-8', 'replace')}\n")
    stream.flush()


def _pump(state: _Rank, name: str, fd: int, sel: selectors.BaseSelector) -> bool:
    """Read what a rank wrote; print complete stdout/stderr lines. False once the pipe closed."""
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return True
    except OSError:
        data = b""
    if name == "exit":
        state.partial["exit"] = state.partial.get("exit", b"") + data
        if not data:
            raw = state.partial["exit"]
            state.exitcode = struct.unpack("!q", raw)[0] if len(raw) == 8 else -signal.SIGKILL
    elif name == "result":
        state.partial["result"] += data
        if not data:
            raw = state.partial["result"]
            state.outcome = pickle.loads(raw) if raw else None
    else:
        stream = sys.stdout if name == "out" else sys.stderr
        if data:
            *lines, state.partial[name] = (state.partial[name] + data).split(b"\n")
        elif state.partial[name]:
            lines, state.partial[name] = [state.partial[name]], b""
        else:
            lines = []
        for line in lines:
            _emit(line, state.rank, stream)
    if not data:
        sel.unregister(fd)
    return bool(data)


def _failure_of(state: _Rank, nprocs: int) -> RankError:
    if state.outcome and state.outcome[0] == "error":
        _, exc_type, message, tb = state.outcome
        return RankError(state.rank, nprocs, exc_type, message, tb)
    code = state.exitcode
    if code is not None and code < 0:
        how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
    else:
        how = f"exited with code {code}"
    return RankError(state.rank, nprocs, "ProcessDied", f"the process {how} before returning",
                     "(no Python traceback: the process ended abruptly)")


def _sources(fn: Callable[..., Any]) -> dict[str, list[str]]:
    """Source lines of ``fn``'s file when only this process knows them (a notebook cell)."""
    code = getattr(fn, "__code__", None)
    if code is None or os.path.exists(code.co_filename):
        return {}
    lines = linecache.getlines(code.co_filename)
    return {code.co_filename: lines} if lines else {}


def _module_of(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The module a by-reference function lives in (imported once by the warm server)."""
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name or "")
    if name in (None, "__main__") or not getattr(module, "__file__", None):
        return ()
    return (name,)


def run(fn: Callable[..., Any], nprocs: int = 2, *args: Any, backend: str | None = None,
        device: str | None = None, timeout: float = 120.0, threads: int | None = None,
        **kwargs: Any) -> list:
    """Run ``fn(*args, **kwargs)`` on ``nprocs`` processes with torch.distributed initialised.

    Returns the per-rank return values in rank order. Inside ``fn``, ``dist.get_rank()`` and
    ``dist.get_world_size()`` work as usual (and ``RANK``/``WORLD_SIZE`` are set as torchrun
    sets them). ``backend``/``device`` override the automatic choice (gloo on CPU; NCCL with one
    GPU per rank when there are enough GPUs — see :func:`course_lib.devices.plan`).
    ``timeout`` (seconds) bounds the whole run; ``threads`` sets torch threads per rank.
    The names ``backend``, ``device``, ``timeout`` and ``threads`` belong to ``run``: to give
    ``fn`` arguments with those names, wrap it with ``functools.partial``.

    Raises :class:`RankError` naming the first rank that failed (with its traceback),
    ``TimeoutError`` when ranks do not finish in time; on any error or interrupt all ranks are
    killed before ``run`` returns.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    placement = devices.plan(nprocs, backend, device, threads)
    try:
        payload = cloudpickle.dumps((fn, args, kwargs, _sources(fn)))
    except Exception as exc:
        raise TypeError(f"cannot ship {getattr(fn, '__name__', fn)!r} and its arguments to the "
                        f"ranks: {exc}") from exc

    context = {"sys_path": list(sys.path), "cwd": os.getcwd(), "environ": dict(os.environ)}
    server = _SERVERS.get()
    workdir = tempfile.mkdtemp(prefix="course_lib_run_")
    lifeline_r, lifeline_w = os.pipe()
    ranks: list[_Rank] = []
    sel = selectors.DefaultSelector()
    try:
        for rank in range(nprocs):
            pipes = {name: os.pipe() for name in ("out", "err", "result", "exit")}
            job = (rank, placement, os.path.join(workdir, "store"), timeout, payload, context)
            child_fds = [pipes["out"][1], pipes["err"][1], pipes["result"][1], lifeline_r,
                         pipes["exit"][1]]
            try:
                pid = server.fork(job, child_fds, _module_of(fn))
            finally:
                for _, w in pipes.values():  # the server and the child hold their own copies
                    os.close(w)
            state = _Rank(rank, pid, {name: r for name, (r, _) in pipes.items()})
            ranks.append(state)
            for name, fd in state.fds.items():
                sel.register(fd, selectors.EVENT_READ, (state, name))
        os.close(lifeline_r)
        lifeline_r = -1
        return _supervise(ranks, sel, nprocs, time.monotonic() + timeout, timeout)
    finally:
        for state in ranks:
            state.kill()
        _drain(ranks, sel, deadline=time.monotonic() + 5)
        sel.close()
        for state in ranks:
            for fd in state.fds.values():
                os.close(fd)
        for fd in (lifeline_r, lifeline_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(ranks: list[_Rank], sel: selectors.BaseSelector, nprocs: int, deadline: float,
               timeout: float) -> list:
    """Forward output and collect results until every rank answered, one failed, or time is up."""
    waiting = set(range(nprocs))
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"rank(s) {sorted(waiting)} of {nprocs} did not finish within "
                               f"{timeout:g} s; a collective may be waiting for a rank that never "
                               "calls it (pass a larger timeout= if the work is just slow)")
        for key, _ in sel.select(timeout=min(remaining, 1.0)):
            state, name = key.data
            if _pump(state, name, key.fd, sel):
                continue
            if name == "result":
                if state.outcome is None or state.outcome[0] == "error":
                    _wait_exit(state, sel)
                    raise _failure_of(state, nprocs)
                waiting.discard(state.rank)
            elif name == "exit" and state.rank in waiting and "result" not in _open(sel, state):
                raise _failure_of(state, nprocs)
    return [cloudpickle.loads(state.outcome[1]) for state in ranks]


def _open(sel: selectors.BaseSelector, state: _Rank) -> set:
    return {name for name, fd in state.fds.items() if fd in sel.get_map()}


def _wait_exit(state: _Rank, sel: selectors.BaseSelector, limit: float = 2.0) -> None:
    """Give a rank that reported a failure a moment to exit, so its last output is shown."""
    end = time.monotonic() + limit
    while _open(sel, state) and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            other, name = key.data
            _pump(other, name, key.fd, sel)


def _drain(ranks: list[_Rank], sel: selectors.BaseSelector, deadline: float) -> None:
    """After the kill: print what ranks wrote last and wait until the server reaped each one."""
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            state, name = key.data
            _pump(state, name, key.fd, sel)
