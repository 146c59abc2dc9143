"""Timing experiments kept on disk, for machines that cannot run them (chapters 02, 05).

An experiment that needs 2 usable cores, or network namespaces for its shaped link, cannot
show its effect on a one-core Binder pod or where namespaces are refused. There the notebook
shows the run stored in ``data/speed_lessons.json`` by ``benchmarks/record_speed_lessons.py``,
labelled with the machine, the date and the load it was recorded at — never as if measured
here. The file is plain JSON (``json.loads``: nothing in it can run code); a record missing
the fields its chapter reads is refused with the field named.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Callable, Iterable

from course_lib.common import machine

__all__ = ["SPEED_PATH", "cpu_model", "machine_meta", "save_record", "load_record",
           "live_or_recorded"]

SPEED_PATH = Path(__file__).resolve().parents[2] / "data" / "speed_lessons.json"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what :mod:`platform` knows)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _priority() -> int:
    """This process's nice value, plus its scheduler autogroup's (Linux: sessions are weighed
    against each other by the autogroup's nice, tasks inside one by their own)."""
    try:
        with open("/proc/self/autogroup") as f:
            group = int(f.read().split("nice")[1])
    except (OSError, IndexError, ValueError):
        group = 0
    return os.nice(0) + group


def machine_meta(command: str) -> dict:
    """Where and when a record was made, and the command that makes it again."""
    import torch  # here: a record is made by benchmarks, not on the way to every import

    return {"cpu": cpu_model(), "cores": machine.usable_cores(), "torch": torch.__version__,
            "python": platform.python_version(), "kernel": platform.release(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_1min": round(os.getloadavg()[0], 1), "nice": _priority(), "command": command}


def save_record(name: str, value, meta: dict, path: str | Path = SPEED_PATH) -> None:
    """Store ``value`` (plain JSON data) as experiment ``name`` with ``meta``; others are kept."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = {"meta": meta, "value": value}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def load_record(name: str, fields: Iterable[str], path: str | Path = SPEED_PATH):
    """``(value, label)`` of experiment ``name``; ``ValueError`` if it lacks one of ``fields``
    (in a dict, or in every dict of a list)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get(name), dict):
        raise ValueError(f"{path}: no record named {name!r}")
    value, meta = data[name].get("value"), data[name].get("meta")
    items = value if isinstance(value, list) else [value]
    for item in items:
        if missing := [f for f in fields if not isinstance(item, dict) or f not in item]:
            raise ValueError(f"{path}: record {name!r} lacks the fields {missing}")
    if not isinstance(meta, dict) or not {"cpu", "cores", "date", "load_1min",
                                          "command"} <= set(meta):
        raise ValueError(f"{path}: record {name!r} has no machine description")
    priority = f" at scheduler priority nice {meta['nice']}" if meta.get("nice") else ""
    label = (f"RECORDED, not measured here: {meta['cpu']}, {meta['cores']} usable cores, "
             f"load {meta['load_1min']}{priority}, {meta['date']}; reproduce with: "
             f"{meta['command']}")
    return value, label


def live_or_recorded(name: str, measure: Callable, fields: Iterable[str], needs_cores: int = 2,
                     unavailable: tuple[type[BaseException], ...] = ()):
    """``(value, source)``: ``measure()`` here when this process may use ``needs_cores`` cores
    and ``measure`` does not raise one of ``unavailable``; else the stored record, with why."""
    cores = machine.usable_cores()
    if cores < needs_cores:
        why = (f"this experiment needs {needs_cores} usable cores (one per rank); this process "
               f"may use {cores} (affinity mask and cgroup CPU quota)")
    else:
        try:
            return measure(), "measured live, on this machine, just now"
        except unavailable as exc:
            why = str(exc)
    value, label = load_record(name, fields)
    return value, f"{why}.\n{label}"

