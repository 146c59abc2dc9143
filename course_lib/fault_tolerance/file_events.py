"""Which files a checkpoint save creates, in which order, seen from inside the ranks.

:func:`traced_run` runs a rank function under a Python audit hook (PEP 578) in every rank:
each file opened for writing, ``os.mkdir``, ``os.rename``/``os.replace`` under ``root`` and each
``os.kill`` is written, with the monotonic clock (one clock for all processes of a machine), to
a per-rank log with one ``os.write`` per event, so the events of a rank killed by SIGKILL
survive it. It returns every rank's events in time order and the run's error; chapter 6 draws
them as a timeline with the crash point. The hook only records: it never changes what it sees.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from course_lib.launcher.launch import RankError, run

__all__ = ["traced_run", "classify"]

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def _under(path: object, root: str) -> str | None:
    """``path`` relative to ``root`` if it lies inside it, else None (fds and odd types too)."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        return None
    full = os.path.abspath(os.fspath(path))
    return os.path.relpath(full, root) if full.startswith(root + os.sep) else None


def _record(fn: Callable, root: str, logdir: str, args: tuple, kwargs: dict):
    """Inside a rank: install the audit hook, then run ``fn(root, *args, **kwargs)``."""
    import torch.distributed as dist
    rank = dist.get_rank()
    fd = os.open(os.path.join(logdir, f"rank{rank}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                 0o600)

    def hook(event: str, event_args: tuple) -> None:
        entry = None
        if event == "open" and len(event_args) >= 3:
            path, mode, flags = event_args[:3]
            writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
                       else isinstance(flags, int) and bool(flags & _WRITE_FLAGS))
            rel = _under(path, root) if writing else None
            entry = rel and {"kind": "write", "path": rel}
        elif event == "os.mkdir":
            rel = _under(event_args[0], root)
            entry = rel and {"kind": "mkdir", "path": rel}
        elif event == "os.rename":
            src, dst = _under(event_args[0], root), _under(event_args[1], root)
            entry = src and dst and {"kind": "rename", "path": src, "dst": dst}
        elif event == "os.kill":
            entry = {"kind": "kill", "path": "", "signal": int(event_args[1])}
        if entry:
            entry.update(t=time.monotonic(), rank=rank)
            os.write(fd, (json.dumps(entry) + "\n").encode())

    sys.addaudithook(hook)
    return fn(root, *args, **kwargs)


def traced_run(fn: Callable, nprocs: int, root, *args, **kwargs) -> dict:
    """``run(fn, nprocs, root, *args, **kwargs)`` with every rank's file events under ``root``
    recorded. Returns ``events`` (time order; ``t`` in seconds from the first), ``error`` (the
    first line of a :class:`RankError`, else None) and ``result`` (the ranks' results or None)."""
    root = os.path.abspath(os.fspath(root))
    os.makedirs(root, exist_ok=True)
    logdir = tempfile.mkdtemp(prefix="course_lib_files_")
    error = result = None
    try:
        try:
            result = run(_record, nprocs, fn, root, logdir, args, kwargs)
        except RankError as err:
            error = str(err).splitlines()[0]
        events = [json.loads(line) for log in sorted(Path(logdir).iterdir())
                  for line in log.read_text().splitlines() if line.strip()]
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    events.sort(key=lambda e: e["t"])
    start = events[0]["t"] if events else 0.0
    for e in events:
        e["t"] -= start
    return {"events": events, "error": error, "result": result}


def classify(event: dict) -> str:
    """What an event means for the commit protocol: ``"tmp dir"``, ``"shard"``, ``"metadata"``,
    ``"marker"``, ``"commit rename"``, ``"crash"`` or ``"other"``."""
    name = Path(event.get("dst") or event["path"]).name
    if event["kind"] == "kill":
        return "crash"
    if event["kind"] == "mkdir" and name.endswith(".tmp"):
        return "tmp dir"
    if event["kind"] == "rename" and not event["dst"].endswith(".tmp") and \
            event["path"].endswith(".tmp") and "/" not in event["dst"]:
        return "commit rename"
    if name.startswith("manifest.json"):
        return "marker"
    if name.endswith(".distcp"):
        return "shard"
    if name.startswith(".metadata"):
        return "metadata"
    return "other"
