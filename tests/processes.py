"""Helpers for tests that start processes: which ranks exist, and waiting for them to go."""
from __future__ import annotations

import os
import time

import psutil


def wait_gone(pids, timeout: float = 10.0) -> list[int]:
    """Return the pids still alive (not zombies) after waiting up to ``timeout`` seconds."""
    end = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < end:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def rank_processes() -> list[psutil.Process]:
    """Processes forked by this test process's warm server (the ranks), plus stray children."""
    me = psutil.Process()
    found = []
    for child in me.children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "course_lib.launcher._warm import serve" in cmd and child.ppid() == os.getpid():
            found += child.children(recursive=True)  # ranks under the server
        elif "course_lib.launcher._warm" not in cmd:
            found.append(child)
    return found
