"""A safeguard of :func:`course_lib.run`: Stop held back while ranks start.

:func:`holding_interrupts`: while the launcher sends jobs to the warm server and reads back the
pids, an interrupt (the notebook's Stop button is a SIGINT) is recorded instead of raised, then
raised as soon as the block ends, when every started rank is known and can be ended. An
interrupt in the middle of that exchange once left pids unread, so later runs matched ranks to
wrong pids and left orphans. A second Stop during the block is not held back: the launcher then
discards the server (see :meth:`course_lib._warm.WarmServer.fork`).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def holding_interrupts() -> Iterator[None]:
    """Hold back one SIGINT until the block ends (main thread only: others never get one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def record(signum, frame):
        if pending:  # pressed again: the user means it, now
            raise KeyboardInterrupt
        pending.append(signum)

    try:
        previous = signal.signal(signal.SIGINT, record)
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            signal.raise_signal(signal.SIGINT)  # handled by the restored handler, as it would be
