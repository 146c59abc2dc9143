"""A warm server forked from the calling process instead of a fresh interpreter.

For a process that imported torch itself and must keep its ranks beside it: chapter 11's
slow-link child, which entered its own network namespace before importing torch. Its server
(``_warm.serve``) is then a fork of it: no interpreter starts, nothing is imported twice
(~4 s of CPU on 2 cores). The caller must run no thread when it forks; the server's lifeline
is a pipe the caller holds, so the server ends with it.
"""
from __future__ import annotations

import os
import signal
import socket

from course_lib.launcher._warm import WarmServer, serve


class _ForkedServer:
    """What :class:`WarmServer` needs of a ``Popen`` (poll, kill) for a server made by fork."""

    def __init__(self, pid: int, lifeline: int):
        self.pid, self.lifeline, self.code = pid, lifeline, None

    def poll(self) -> int | None:
        if self.code is None and os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:
            self.code = 0
        return self.code

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def fork_server() -> WarmServer:
    """Fork a warm server from this process; its handle (ready once it greets)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    life_r, life_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the server
        try:
            ours.close()
            os.close(life_w)
            os.dup2(life_r, 0)
            serve(theirs.fileno())
        finally:
            os._exit(70)
    theirs.close()
    os.close(life_r)
    return WarmServer(_ForkedServer(pid, life_w), ours)
