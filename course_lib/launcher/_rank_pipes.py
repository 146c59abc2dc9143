"""The parent's side of each rank's pipes, for :func:`course_lib.run` (chapter 00).

Every rank writes four pipes: stdout and stderr (shown live, prefixed ``[rank r]``), its pickled
result or traceback, and its exit status (sent by the warm server when it reaps the rank).
:class:`Rank` holds the read ends and what arrived; :func:`pump` reads whatever is ready;
:func:`drain` and :func:`wait_exit` collect the last words of ranks that are ending.
"""
from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from course_lib.launcher import progress


@dataclass
class Rank:
    """The parent's handle on one rank: its pid, pipes and what it has said."""

    rank: int
    pid: int
    fds: dict  # name -> read end: "out", "err", "result", "exit"
    partial: dict = field(default_factory=lambda: {"out": b"", "err": b"", "result": b""})
    outcome: tuple | None = None
    exitcode: int | None = None
    stamps: list = field(default_factory=list)  # (phase, time.monotonic()) from the rank

    def kill(self) -> None:
        if self.exitcode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def emit(line: bytes, rank: int, stream: TextIO) -> None:
    # "[rank r] ..." as it arrives; in a watched notebook long logs fold (course_lib.progress)
    progress.emit(line.decode("utf-8", "replace"), rank, stream)


def pump(state: Rank, name: str, fd: int, sel: selectors.BaseSelector) -> bool:
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
            state.outcome, state.stamps = pickle.loads(raw) if raw else (None, [])
    else:
        stream = sys.stdout if name == "out" else sys.stderr
        if data:
            *lines, state.partial[name] = (state.partial[name] + data).split(b"\n")
        elif state.partial[name]:
            lines, state.partial[name] = [state.partial[name]], b""
        else:
            lines = []
        for line in lines:
            emit(line, state.rank, stream)
    if not data:
        sel.unregister(fd)
    return bool(data)


def open_pipes(sel: selectors.BaseSelector, state: Rank) -> set:
    return {name for name, fd in state.fds.items() if fd in sel.get_map()}


def wait_exit(state: Rank, sel: selectors.BaseSelector, limit: float = 2.0) -> None:
    """Give a rank that reported a failure a moment to exit, so its last output is shown."""
    end = time.monotonic() + limit
    while open_pipes(sel, state) and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            other, name = key.data
            pump(other, name, key.fd, sel)


def drain(ranks: list[Rank], sel: selectors.BaseSelector, deadline: float,
           wait_exit: bool = True) -> None:
    """After the kill: print what ranks wrote last and (``wait_exit``) wait until the server
    reaped each one and sent its exit status."""
    def pending() -> bool:
        return any(wait_exit or key.data[1] != "exit" for key in sel.get_map().values())

    while pending() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            state, name = key.data
            pump(state, name, key.fd, sel)
