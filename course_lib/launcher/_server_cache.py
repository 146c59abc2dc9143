"""The warm server of this process, and when it ends: after an idle time, and (in a learner's
pod) for a torchrun job. :mod:`course_lib.launcher.launch` keeps the one instance, ``_SERVERS``.

Issue 50: every open chapter kept a process with torch loaded (about a quarter GiB) until its
kernel ended; ``benchmarks/bench_pod_memory.py`` measures what this gives back.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

from course_lib.launcher._run_guard import sweep_stale_run_dirs
from course_lib.launcher._warm import WarmServer


def idle_seconds() -> float:
    """How long the warm server may sit unused before it ends and gives its memory back.

    ``COURSE_HELPER_IDLE_SECONDS`` (default 120): a chapter left open for two minutes then holds
    only its kernel, not a second process with torch loaded (about half a GiB). The next ``run``
    starts a fresh server and waits for it (the wait: ``benchmarks/bench_launch.py``). ``0``
    or a negative value: never end it.
    """
    raw = os.environ.get("COURSE_HELPER_IDLE_SECONDS", "120")
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"COURSE_HELPER_IDLE_SECONDS must be a number of seconds, got {raw!r}") \
            from None


class ServerCache:
    """The one warm server of this process, started on first use (restarted if it died).

    A watcher thread ends the server once no ``run`` has used it for :func:`idle_seconds`; it
    takes the same lock as :meth:`get`, and a run in flight holds it busy (:meth:`using`), so a
    server is never ended under a run that is about to fork from it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: WarmServer | None = None
        self._swept = False
        self._busy = 0
        self._last_used = time.monotonic()
        self._may_idle = True  # False for a server forked from this process (serve_from_here)
        self._watcher: threading.Thread | None = None

    def get(self, wait: bool = True) -> WarmServer:
        """The server, started if needed; ready to fork unless ``wait=False``."""
        with self._lock:
            if self._server is None or not self._server.alive():
                if not self._swept:  # once per kernel: folders of killed kernels go
                    sweep_stale_run_dirs()
                    self._swept = True
                self._server = WarmServer.start(wait=False)
                self._may_idle = True
                self._last_used = time.monotonic()
                self._watch()
            self._last_used = time.monotonic()  # asking for it counts as using it
            server = self._server
        if wait:
            server.wait_ready()
        return server

    @contextmanager
    def using(self):
        """The server, held busy (the idle watcher leaves it alone) until the block ends."""
        with self._lock:
            self._busy += 1
        try:
            yield self.get()
        finally:
            with self._lock:
                self._busy -= 1
                self._last_used = time.monotonic()

    def _watch(self) -> None:
        """Start the idle watcher once (called with the lock held)."""
        if idle_seconds() <= 0 or (self._watcher is not None and self._watcher.is_alive()):
            return
        self._watcher = threading.Thread(target=self._end_when_idle, name="course-idle-server",
                                         daemon=True)
        self._watcher.start()

    def _end_when_idle(self) -> None:
        owner = os.getpid()
        while True:
            limit = idle_seconds()
            if limit <= 0:
                return
            time.sleep(min(5.0, max(limit / 4, 0.05)))
            if os.getpid() != owner:  # a fork of this process: not its server
                return
            with self._lock:
                server = self._server
                if server is None or not server.alive() or not self._may_idle:
                    continue
                if self._busy or time.monotonic() - self._last_used < limit:
                    continue
                self._server = None
            server.close()

    def end(self) -> bool:
        """End the server now, unless none runs, a run holds it, or it was forked from this
        process; True if one was ended."""
        with self._lock:
            server = self._server
            if server is None or not server.alive() or not self._may_idle or self._busy:
                return False
            self._server = None
        server.close()
        return True

    def mark_forked(self, server: WarmServer) -> None:
        """Adopt a server forked from this process: it is never ended for idleness."""
        with self._lock:
            self._server, self._may_idle = server, False


_SMALL_POD = 4 * 1024 ** 3  # a memory limit at or under this is a learner's pod (Binder: 1-2 GB)


def memory_limit() -> int | None:
    """The memory limit on this process in bytes: the smallest ``memory.max`` of its cgroup v2
    and the groups above it, or its cgroup v1 ``memory.limit_in_bytes``; None when there is none."""
    limits = []
    try:
        with open("/proc/self/cgroup") as f:
            groups = dict(line.rstrip("\n").split(":", 2)[1:] for line in f if line.count(":") >= 2)
    except OSError:
        return None
    for controller, root, name in (("", "/sys/fs/cgroup", "memory.max"),
                                   ("memory", "/sys/fs/cgroup/memory", "memory.limit_in_bytes")):
        path = groups.get(controller)
        while path is not None:
            try:
                with open(os.path.join(root, path.lstrip("/"), name)) as f:
                    limits.append(int(f.read()))
            except (OSError, ValueError):  # absent, or "max" (no limit)
                pass
            path = None if path in ("/", "") else os.path.dirname(path)
    limits = [limit for limit in limits if limit < 2 ** 60]  # v1 writes "no limit" as ~2**63
    return min(limits) if limits else None


def pauses_for_torchrun() -> bool:
    """Whether :func:`server_paused` ends the server: ``COURSE_PAUSE_SERVER`` ``1`` always,
    ``0`` never, ``auto`` (default) where this process's memory limit is 4 GiB or less (a
    learner's pod: there memory runs out; elsewhere the restart after the job, about 3 s of CPU,
    would only slow the next ``run``)."""
    raw = os.environ.get("COURSE_PAUSE_SERVER", "auto")
    if raw not in ("0", "1", "auto"):
        raise ValueError(f"COURSE_PAUSE_SERVER must be 0, 1 or auto, got {raw!r}")
    if raw != "auto":
        return raw == "1"
    limit = memory_limit()
    return limit is not None and limit <= _SMALL_POD
