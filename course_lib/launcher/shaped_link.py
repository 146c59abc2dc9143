"""Run a course function on two ranks joined by a shaped link: real wire time for gloo's bytes.

:func:`run_pair` starts a hub in a network namespace (:mod:`course_lib.launcher.netns`), which
starts two nodes, joins them with a veth pair and, per job, shapes both ends (``tc``: a rate in
Mbit/s, 0 = unthrottled) and has both nodes call ``target(**kwargs, cache=...)``: a function of
a ``course_lib`` module, named ``"course_lib.pkg.module:function"``, that runs inside an
initialised gloo group (2 ranks, over the veth) and returns plain JSON data. ``cache`` is a dict
a node keeps across jobs (a model built once). ``pin=True`` pins rank r to core r of the cores
this process may use (one busy rank per core); where fewer than 2 are usable the ranks share
one, and each result says which core its rank had. Chapter 02's overlap and chapter 05's
scaling over a slow link use it; chapter 05's link sweep has its own protocol on the same
mechanics.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from course_lib.launcher.devices import usable_cores
from course_lib.launcher.netns import LinkUnavailable, Nodes, availability, die_with_parent, \
    prefix, shape, wire

__all__ = ["run_pair", "LinkUnavailable", "availability"]

_TARGET = re.compile(r"course_lib(\.[A-Za-z_]\w*)+:[A-Za-z_]\w*")


def _resolve(target: str):
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        raise ValueError(f"target must name a course_lib function as 'course_lib.pkg.module:"
                         f"function', got {target!r}")
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def run_pair(target: str, jobs: Sequence[tuple[float, dict]], *, threads: int = 1,
             pin: bool = True, timeout: float = 120.0) -> list[list]:
    """Per job ``(rate_mbit, kwargs)``: the two ranks' results of ``target`` over that link.

    Raises ``ValueError`` for bad input and :class:`LinkUnavailable` (with the reason) where no
    namespace can be made, both before any process starts.
    """
    _resolve(target)  # bad names fail here, and the module's own import errors too
    jobs = [(float(rate), dict(kwargs)) for rate, kwargs in jobs]
    if not jobs or any(rate < 0 for rate, _ in jobs):
        raise ValueError("jobs must be a non-empty list of (rate_mbit >= 0, kwargs)")
    mode, reason = availability()
    if mode is None:
        raise LinkUnavailable(reason)
    cores = sorted(os.sched_getaffinity(0))[:usable_cores()]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory(prefix="shaped_link_") as tmp:
        os.chmod(tmp, 0o700)
        opts = {"init": f"file://{tmp}/store", "threads": threads, "pin": pin, "cores": cores,
                "target": target, "jobs": jobs}
        proc = subprocess.Popen([*prefix(mode), sys.executable, "-m",
                                 "course_lib.launcher.shaped_link", "hub"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = proc.communicate(json.dumps(opts) + "\n", timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the two ranks over the shaped link did not finish within "
                               f"{timeout:g} s; their processes were stopped") from None
        finally:
            if proc.poll() is None:  # the nodes die with the hub (PR_SET_PDEATHSIG)
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"the two ranks over the shaped link failed (exit {proc.returncode})"
                           f":\n{err[-3000:]}")
    return [json.loads(line)["ranks"] for line in out.splitlines() if line.startswith('{"job"')]


def _cores_of(rank: int, threads: int, cores: list[int]) -> list[int]:
    """Rank r's cores: r·threads … when there are enough, else the cores taken round-robin."""
    if (rank + 1) * threads <= len(cores):
        return cores[rank * threads:(rank + 1) * threads]
    return [cores[(rank * threads + i) % len(cores)] for i in range(threads)]


def node_main() -> None:
    """One node: wait for the hub to wire the namespace, pin, join the group, run the jobs."""
    die_with_parent()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    setup = json.loads(sys.stdin.readline())
    rank = setup["rank"]
    mine = _cores_of(rank, setup["threads"], setup["cores"])
    if setup["pin"]:
        os.sched_setaffinity(0, mine)  # before torch and gloo start their threads
    import torch
    import torch.distributed as dist
    torch.set_num_threads(setup["threads"])
    os.environ["GLOO_SOCKET_IFNAME"] = setup["iface"]
    fn = _resolve(setup["target"])
    dist.init_process_group("gloo", init_method=setup["init"], rank=rank, world_size=2)
    print(json.dumps({"joined": rank}), flush=True)
    cache: dict = {}
    info = {"rank": rank, "cores": sorted(os.sched_getaffinity(0)),
            "shared_core": len(setup["cores"]) < 2 * setup["threads"]}
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("stop"):
            break
        print(json.dumps({**info, "result": fn(**job["kwargs"], cache=cache)}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # gloo threads may abort a normal interpreter shutdown


def hub_main() -> None:
    """Build the two-node network, run every job on its link, print one JSON line per job."""
    die_with_parent()
    opts = json.loads(sys.stdin.readline())
    nodes = Nodes("course_lib.launcher.shaped_link")
    try:
        pids = [reply["ready"] for reply in nodes.receive()]
        ifaces = wire(pids, os.getpid())
        for rank, iface in enumerate(ifaces):
            nodes.send(rank, {"rank": rank, "iface": iface, **{k: opts[k] for k in (
                "init", "threads", "pin", "cores", "target")}})
        nodes.receive()
        start = time.monotonic()
        for index, (rate, kwargs) in enumerate(opts["jobs"]):
            for pid, iface in zip(pids, ifaces):
                shape(pid, iface, rate)
            ranks = nodes.ask({"kwargs": kwargs})
            print(json.dumps({"job": index, "rate_mbit": rate, "ranks": ranks,
                              "at_s": time.monotonic() - start}), flush=True)
        for rank in range(2):
            nodes.send(rank, {"stop": True})
        for proc in nodes.procs:
            proc.wait(30)
    finally:
        nodes.close()


if __name__ == "__main__":
    {"hub": hub_main, "node": node_main}[sys.argv[1]]()
