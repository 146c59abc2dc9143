"""The parent's side of each rank's pipes, for :func:`course_lib.run` (chapter 00).

Every rank writes four pipes: stdout and stderr (shown live, prefixed ``[rank r]``), its pickled
result or traceback, and its exit status (sent by the warm server when it reaps the rank).
:class:`Rank` holds the read ends and what arrived; :func:`pump` reads whatever is ready;
:func:`drain` and :func:`wait_exit` collect the last words of ranks that are ending. A process's
abort dump (from "terminate called" or "Fatal Python error" on) is held back in ``Rank.dump``
for the error to show folded, not streamed line by line into the cell.
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import selectors
import signal
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from course_lib.launcher import _results, progress

PIPES = ("out", "err", "result", "exit")
LAST_LINES = 15  # what a rank wrote last (both streams), shown when it dies without a traceback
# the first line of what a process writes as it aborts: C++'s terminate, CPython's fatal error
_CRASH = re.compile(r"terminate called |Fatal Python error: ")

@dataclass
class Rank:
    """The parent's handle on one rank: its pid, pipes and what it has said."""

    rank: int
    pid: int
    fds: dict  # name -> read end: "out", "err", "result", "exit"
    # bytes received but not used yet, per pipe: appended to in place (linear in the size)
    partial: dict = field(default_factory=lambda: {n: bytearray() for n in PIPES})
    outcome: tuple | None = None
    exitcode: int | None = None
    stamps: list = field(default_factory=list)  # (phase, time.monotonic()) from the rank
    err_tail: deque = field(default_factory=lambda: deque(maxlen=60))  # last stderr lines
    said: deque = field(default_factory=lambda: deque(maxlen=LAST_LINES))  # stdout and stderr
    dump: list = field(default_factory=list)  # a dying process's raw dump, held back (folded)
    dump_shown: bool = False  # the dump went into the RankError raised for this rank

    def kill(self) -> None:
        """SIGKILL the rank and its process group (what it started), unless it was reaped."""
        if self.exitcode is None:
            for kill in (os.killpg, os.kill):  # the group; the rank alone if it has none
                with contextlib.suppress(ProcessLookupError):
                    kill(self.pid, signal.SIGKILL)
                    return


def pump(state: Rank, name: str, fd: int, sel: selectors.BaseSelector) -> bool:
    """Read what a rank wrote; print complete stdout/stderr lines. False once the pipe closed.

    Bytes collect in a ``bytearray`` (a 100 MB result or an endless line costs linear time).
    A result cut short (the rank was killed while sending it) leaves ``outcome`` at ``None``:
    the caller then reports the real reason (a timeout, another rank's error, an interrupt).
    """
    try:
        data = os.read(fd, 1 << 20)
    except BlockingIOError:
        return True
    except OSError:
        data = b""
    buf = state.partial[name]
    if name in ("exit", "result"):
        buf += data
        if not data and name == "exit":
            state.exitcode = struct.unpack("!q", buf)[0] if len(buf) == 8 else -signal.SIGKILL
        elif not data:
            state.outcome, state.stamps = _unpickle(buf)
            state.partial[name] = bytearray()
    else:
        stream = sys.stdout if name == "out" else sys.stderr
        lines = []
        if b"\n" in data:
            *lines, rest = (bytes(buf) + data).split(b"\n")
            state.partial[name] = bytearray(rest)
        elif data:
            buf += data
        elif buf:
            lines, state.partial[name] = [bytes(buf)], bytearray()
        for line in lines:
            text = line.decode("utf-8", "replace")
            if name == "err" and (state.dump or _CRASH.match(text)):
                state.dump.append(text)  # shown folded under the error's one-line summary
            else:  # "[rank r] ..." as it arrives; in a watched notebook long logs fold
                progress.emit(text, state.rank, stream)
            if name == "err":
                state.err_tail.append(text)
            state.said.append(text)
    if not data:
        sel.unregister(fd)
    return bool(data)


def _unpickle(raw: bytearray) -> tuple:
    """``(outcome, stamps)`` from a rank's complete result, or ``(None, [])`` if it is cut short."""
    try:
        (outcome, stamps), value_pickle = _results.read(raw)
    except Exception:  # noqa: BLE001 - truncated (None): the rank died while writing it
        return None, []
    return (("ok", value_pickle) if outcome[0] == "ok" else outcome), stamps


def settle(state: Rank, sel: selectors.BaseSelector) -> None:
    """The rank's process is gone (its exit status came): read what its result pipe holds and stop
    waiting on it. Whatever it wrote is in the pipe by now, but the pipe need not close: a
    process the rank started (in a session of its own: the server's kill of the rank's group
    misses it) may hold its write end, and then no end-of-file would ever come."""
    fd = state.fds["result"]
    while fd in sel.get_map() and select.select([fd], [], [], 0)[0]:
        pump(state, "result", fd, sel)  # at the end-of-file it parses the result itself
    if fd in sel.get_map():  # still held open: what arrived is all there will be
        sel.unregister(fd)
        state.outcome, state.stamps = _unpickle(state.partial["result"])


def open_pipes(sel: selectors.BaseSelector, state: Rank) -> set:
    return {name for name, fd in state.fds.items() if fd in sel.get_map()}


def pump_until(sel: selectors.BaseSelector, done: Callable[[], bool], deadline: float) -> None:
    """Read every rank's pipes until ``done()`` or the ``time.monotonic()`` deadline."""
    while not done() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.05):
            pump(key.data[0], key.data[1], key.fd, sel)


def wait_exit(state: Rank, sel: selectors.BaseSelector, limit: float = 2.0) -> None:
    """Give a rank that reported a failure a moment to exit, so its last output is shown."""
    pump_until(sel, lambda: not open_pipes(sel, state), time.monotonic() + limit)


def drain(sel: selectors.BaseSelector, deadline: float, wait_exit: bool = True) -> None:
    """After the kill: print what ranks wrote last and (``wait_exit``) wait until the server
    reaped each one and sent its exit status."""
    pump_until(sel, lambda: not any(wait_exit or key.data[1] != "exit"
                                    for key in sel.get_map().values()), deadline)
