"""The machine probe: how many cores this process may keep busy (affinity mask and cgroup quota).

Every launcher sizes threads and world sizes from :func:`usable_cores`; the stored-run records
(:mod:`course_lib.common.recorded`) label a run with it. It reads files only, imports no torch.
"""
from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

__all__ = ["usable_cores", "own_cgroups", "cgroup_cpu_quota"]


def usable_cores(cgroup_root: str = "/sys/fs/cgroup",
                 proc_cgroup: str = "/proc/self/cgroup") -> int:
    """Cores this process may keep busy: its affinity mask, capped by its cgroup's CPU quota.

    ``floor(quota / period)``, at least 1. A Kubernetes or Binder pod limited to 2 CPUs on a
    64-core host sees 64 cores in its affinity mask but gets 2 CPUs' worth of time; ``taskset
    -c 0`` limits the mask, not the quota: both must be read. Pinning one rank per core and
    choosing world sizes from this count keeps every busy rank on a core of its own.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    return max(1, min(cores, math.floor(quota))) if quota else cores


def own_cgroups(proc_cgroup: str = "/proc/self/cgroup") -> dict[str, str]:
    """This process's cgroup path per hierarchy: ``""`` for v2, ``"cpu"`` for v1's cpu one."""
    paths = {}
    with contextlib.suppress(OSError, ValueError), open(proc_cgroup) as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                paths[""] = path
            elif "cpu" in controllers.split(","):
                paths["cpu"] = path
    return paths


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup",
                     proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """CPUs allowed by the cgroups (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cfs_period_us``)
    of this process and every cgroup above it, the smallest; None if unlimited."""
    own = own_cgroups(proc_cgroup)
    found = []
    for kind, mount in (("", root), ("cpu", os.path.join(root, "cpu")),
                        ("cpu", os.path.join(root, "cpu,cpuacct"))):
        parts = [p for p in own.get(kind, "/").split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):  # own cgroup first, then each parent
            folder = os.path.join(mount, *parts[:depth])
            found.append(_read_v2(folder) if kind == "" else _read_v1(folder))
    return min(filter(None, found), default=None)


def _read_v2(folder: str) -> float | None:
    try:
        quota, period = Path(folder, "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _read_v1(folder: str) -> float | None:
    try:
        quota, period = (int(Path(folder, name).read_text())
                         for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None
