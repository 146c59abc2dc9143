"""Run a course function over a shaped link: real wire time for gloo's bytes (chapters 02, 05, 11).

The course's one hub for shaped links. The *hub* (``python -m course_lib.launcher.shaped_link
hub``) enters fresh network and mount namespaces (:func:`course_lib.launcher._private_net.enter`),
reads its options as one JSON line and, per job ``(rate_mbit, latency_ms, kwargs)``, shapes the
link (``tc``; rate 0 = unthrottled) and calls ``target(**kwargs, cache=...)``: a ``course_lib``
function named ``"course_lib.pkg.module:function"`` returning JSON data (``cache``: a dict kept
across jobs); one JSON line per job. :func:`run_pair`: two nodes joined by a veth pair
(:mod:`~course_lib.launcher.netns`), the target in a gloo group of 2 ranks over it; ``pin=True``
pins rank r to core r of the usable cores (with fewer than 2 they share one; each result says
which). :func:`run_on_loopback`: the hub alone, its loopback shaped, the ``run`` ranks inside.
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

from course_lib.launcher import _private_net
from course_lib.launcher._warm import preload
from course_lib.launcher.devices import usable_cores
from course_lib.launcher.launch import serve_from_here, server_paused
from course_lib.launcher.netns import LinkUnavailable, MTU, Nodes, availability, \
    die_with_parent, shape, wire

__all__ = ["run_pair", "run_on_loopback", "LinkUnavailable", "availability"]

_TARGET = re.compile(r"course_lib(\.[A-Za-z_]\w*)+:[A-Za-z_]\w*")
_PAIR = "the two ranks over the shaped link"


def _resolve(target: str):
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        raise ValueError(f"target must name a course_lib function as 'course_lib.pkg.module:"
                         f"function', got {target!r}")
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _jobs(jobs: Sequence[tuple]) -> list[tuple[float, float, dict]]:
    """``(rate, kwargs)`` or ``(rate, latency_ms, kwargs)`` items as ``(rate, latency, kwargs)``."""
    out = [(float(job[0]), float(job[1]) if len(job) == 3 else 0.0, dict(job[-1]))
           for job in jobs]
    if not out or any(rate < 0 or latency < 0 for rate, latency, _ in out):
        raise ValueError("jobs must be a non-empty list of (rate_mbit >= 0, [latency_ms >= 0,] "
                         "kwargs)")
    return out


def _hub(opts: dict, timeout: float, what: str) -> list[dict]:
    """Start the hub with ``opts``; its JSON lines (``LinkUnavailable`` if it was refused)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory(prefix="shaped_link_") as tmp:  # 0700: ours alone
        proc = subprocess.Popen([sys.executable, "-m", "course_lib.launcher.shaped_link", "hub"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = proc.communicate(json.dumps({**opts, "init": f"file://{tmp}/store"})
                                        + "\n", timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{what} did not finish within {timeout:g} s; their processes "
                               "were stopped") from None
        finally:
            if proc.poll() is None:  # the nodes die with the hub (PR_SET_PDEATHSIG)
                proc.kill()
                proc.wait()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if refused := next((line["refused"] for line in lines if "refused" in line), None):
        raise LinkUnavailable(refused)
    if proc.returncode != 0 or sum("job" in line for line in lines) != len(opts["jobs"]):
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return [line for line in lines if "job" in line]


def run_pair(target: str, jobs: Sequence[tuple], *, threads: int = 1, pin: bool = True,
             timeout: float = 120.0, what: str = _PAIR, mode: str | None = None) -> list[list]:
    """Per job ``(rate_mbit, [latency_ms,] kwargs)``: the two ranks' results of ``target``.

    Each rank's result is ``{"rank", "cores", "shared_core", "result"}``. Raises ``ValueError``
    for bad input and :class:`LinkUnavailable` (with the reason) where no namespace can be made,
    both before any process starts (``mode``: an :func:`availability` the caller already has).
    The warm server is paused meanwhile (issue 50).
    """
    _resolve(target)  # bad names fail here, and the module's own import errors too
    jobs = _jobs(jobs)
    if mode is None:
        delay = any(latency for _, latency, _ in jobs)  # then netem must exist too
        mode, reason = availability(latency=True) if delay else availability()
        if mode is None:
            raise LinkUnavailable(reason)
    cores = sorted(os.sched_getaffinity(0))[:usable_cores()]
    opts = {"threads": threads, "pin": pin, "cores": cores, "target": target, "jobs": jobs}
    with server_paused():  # hub and nodes import torch themselves: no idle server beside them
        return [line["ranks"] for line in _hub(opts, timeout, what)]


def run_on_loopback(target: str, jobs: Sequence[tuple], *, preload: Sequence[str] = (),
                    timeout: float = 180.0, what: str = "the run over the shaped loopback") -> list:
    """Per job: ``target``'s result with the hub's own loopback shaped (its ``run`` ranks, forked
    inside the hub after it imported ``preload``, talk over it). :class:`LinkUnavailable` where
    the kernel refuses a namespace; the warm server is paused meanwhile (issue 50)."""
    _resolve(target)
    opts = {"loopback": True, "target": target, "jobs": _jobs(jobs), "preload": list(preload)}
    with server_paused():
        return [line["ranks"][0] for line in _hub(opts, timeout, what)]


def _cores_of(rank: int, threads: int, cores: list[int]) -> list[int]:
    """Rank r's cores: r·threads … when there are enough, else the cores taken round-robin."""
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


def _pair(opts: dict, report) -> None:
    """Two nodes joined by a veth pair, both ends shaped per job. The nodes are forks of this
    hub after it imported torch, what the warm server preloads and the target: they share
    those pages instead of importing torch each (issue 50: chapter 05's link sweep)."""
    _resolve(opts["target"])
    preload()
    nodes = Nodes("course_lib.launcher.shaped_link", node=node_main)
    try:
        pids = [reply["ready"] for reply in nodes.receive()]
        ifaces = wire(pids, os.getpid())
        for rank, iface in enumerate(ifaces):
            nodes.send(rank, {"rank": rank, "iface": iface, **{k: opts[k] for k in (
                "init", "threads", "pin", "cores", "target")}})
        nodes.receive()
        for index, (rate, latency, kwargs) in enumerate(opts["jobs"]):
            for pid, iface in zip(pids, ifaces):
                shape(pid, iface, rate, latency)
            for rank in range(2):
                nodes.send(rank, {"kwargs": kwargs})
            report(index, rate, latency, nodes.receive())
        for rank in range(2):
            nodes.send(rank, {"stop": True})
        for proc in nodes.procs:
            proc.wait(30)
    finally:
        nodes.close()


def _loopback(opts: dict, report) -> None:
    """The hub alone: its loopback gets the veth's MTU and, per job, the shaping."""
    subprocess.run(["ip", "link", "set", "lo", "mtu", str(MTU)], check=True)
    fn = _resolve(opts["target"])
    for module in opts["preload"]:
        importlib.import_module(module)
    serve_from_here()  # ranks forked from this process: no second interpreter imports torch
    cache: dict = {}
    for index, (rate, latency, kwargs) in enumerate(opts["jobs"]):
        shape(os.getpid(), "lo", rate, latency)
        report(index, rate, latency, [fn(**kwargs, cache=cache)])


def hub_main() -> None:
    """Enter a namespace, build the link, run every job on it, print one JSON line per job."""
    die_with_parent()
    opts = json.loads(sys.stdin.readline())
    try:
        _private_net.enter(as_root=True)
    except _private_net.Refused as exc:
        print(json.dumps({"refused": f"no private network namespace: {exc}"}), flush=True)
        return
    start = time.monotonic()

    def report(index: int, rate: float, latency: float, ranks: list) -> None:
        print(json.dumps({"job": index, "rate_mbit": rate, "latency_ms": latency, "ranks": ranks,
                          "at_s": time.monotonic() - start}), flush=True)

    (_loopback if opts.get("loopback") else _pair)(opts, report)


if __name__ == "__main__":
    {"hub": hub_main, "node": node_main}[sys.argv[1]]()
