"""Stop in JupyterLab is SIGINT, which Python turns into ``KeyboardInterrupt``; the interrupt tests
send it to themselves. A shell that starts pytest in the background (``pytest &``, ``nohup``, some
CI runners) hands the process SIGINT *ignored*, and Python keeps it ignored — those tests would
then wait for an interrupt that never comes. Each test here gets Python's default handler back."""
from __future__ import annotations

import signal
import threading

import pytest


@pytest.fixture(autouse=True)
def _sigint_raises_keyboard_interrupt():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
