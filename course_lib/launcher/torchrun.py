"""Scripts under the real ``torchrun`` launcher: from a notebook, and on a cluster.

:func:`course_lib.run` is the fast path for interactive cells. This module is the path that
scales past one machine: it runs a script (or ``-m module``) under ``torchrun`` exactly as a
learner would on a cluster, streams each rank's output into the cell as ``[rank r] ...``, and
shows the command line to type on real nodes (:func:`cluster_command`).

Worker scripts call :func:`init_distributed`, which works unchanged under ``torchrun``, under
``course_lib.run`` (already initialised) and as a plain single process (world size 1).
Chapter 00 introduces it; chapter 5 runs two "nodes"; chapter 6 restarts failed workers.
"""
from __future__ import annotations

import atexit
import os
import re
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch.distributed as dist

from course_lib.launcher import _reaper, devices, progress
from course_lib.launcher._forked_workers import worker_mode
from course_lib.launcher._torchrun_errors import (SHARED_LOOPBACK_RISK, SharedLoopbackError,
                                                  TorchrunError)

__all__ = ["torchrun", "torchrun_command", "cluster_command", "init_distributed", "TorchrunError",
           "SharedLoopbackError", "ALLOW_SHARED_LOOPBACK", "SHARED_LOOPBACK_RISK",
           "shared_loopback_allowed", "exit_without_finalizing", "start_reaped", "worker_mode"]

#: The reaper's parent side (:func:`course_lib.launcher._reaper.start`): chapter 05's nodes use it.
start_reaped = _reaper.start
ALLOW_SHARED_LOOPBACK = "COURSE_ALLOW_SHARED_LOOPBACK"  # =1: the opt-in, for a whole session


def shared_loopback_allowed(flag: bool | None) -> bool:
    """The learner's opt-in to the host's loopback: ``flag``, or ``COURSE_ALLOW_SHARED_LOOPBACK=1``."""
    if flag is None:
        return os.environ.get(ALLOW_SHARED_LOOPBACK) == "1"
    if type(flag) is not bool:
        raise TypeError(f"allow_shared_loopback must be True or False, got {flag!r}")
    return flag


_PREFIX = re.compile(rb"^\[(?:default|[a-z_]+)(\d+)\]:(?:\[rank\d+\]:)?")


@dataclass(frozen=True)
class TorchrunResult:
    """What a finished torchrun job printed (rank-prefixed) and how long it took."""

    command: list[str]
    output: str
    seconds: float


def torchrun_command(target: str, nprocs: int = 2, args: Sequence[str] = (), *, nnodes: int = 1,
                     node_rank: int = 0, endpoint: str = "127.0.0.1:0", max_restarts: int = 0,
                     module: bool = False) -> list[str]:
    """The torchrun argument list for ``target`` (a script path, or a module if ``module``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
           f"--nproc-per-node={nprocs}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
           f"--max-restarts={max_restarts}", "--tee=3"]
    if nnodes > 1:
        cmd.append(f"--node-rank={node_rank}")
    if endpoint.startswith("127.0.0.1"):
        cmd.append("--local-addr=127.0.0.1")  # no host-name look-ups on one machine
    cmd += (["-m", target] if module else [target]) + [str(a) for a in args]
    return cmd


def cluster_command(target: str, nprocs_per_node: int, nnodes: int, args: Sequence[str] = (),
                    head: str = "$HEAD_NODE_ADDR:29500", max_restarts: int = 3) -> str:
    """What to type on *each* of ``nnodes`` machines to run ``target`` on a real cluster.

    The command follows a shell comment on what the head node's store exposes: torchrun's c10d
    rendezvous store has no authentication, listens on every interface, and holds a pickle that
    every agent loads, so whoever reaches ``head`` and knows the id (``$JOB_ID``, on every
    node's command line) runs code as you on every node. Keep the port reachable from the job's
    nodes only (the cluster's private network, a firewall); on one shared machine use
    :func:`torchrun` (a private network namespace) instead.
    """
    parts = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nprocs_per_node}",
             "--rdzv-backend=c10d", f"--rdzv-endpoint={head}", "--rdzv-id=$JOB_ID",
             f"--max-restarts={max_restarts}", target, *map(str, args)]
    return (f"# the store at {head} has no authentication and every agent unpickles what it\n"
            "# holds: keep it reachable from the job's nodes only (the cluster's private network)\n"
            + " ".join(parts))


def torchrun(target: str, nprocs: int = 2, args: Sequence[str] = (), *, max_restarts: int = 0,
             timeout: float = 300.0, module: bool = False, env: dict | None = None,
             quiet: bool = False, allow_shared_loopback: bool | None = None) -> TorchrunResult:
    """Run ``target`` under torchrun on this machine; stream its output; raise on failure.

    The whole process tree (torchrun and its workers, which live in their own sessions) is
    supervised by :mod:`course_lib.launcher._reaper`: a timeout, an interrupt or a dying kernel leaves
    no process behind. It runs in a private network namespace, so that no other user of this
    machine can reach torchrun's stores (the job has no network but its own loopback). Where
    the kernel refuses one, it raises :class:`SharedLoopbackError` before the job starts,
    unless ``allow_shared_loopback=True`` (or the environment variable
    ``COURSE_ALLOW_SHARED_LOOPBACK=1``): then it warns and runs on the host's loopback, where
    every local user can list the stores' keys and run code as you (a machine of your own only).
    """
    devices.place(nprocs)  # same limits and messages as run()
    devices.validate_timeout(timeout)
    if not module and not os.path.isfile(target):
        raise FileNotFoundError(f"no script {target!r}; pass module=True for a module name")
    allow_shared_loopback = shared_loopback_allowed(allow_shared_loopback)
    env = {**(env or {}), "COURSE_TORCHRUN_WORKERS": worker_mode()}  # a bad value fails here
    # torchrun's agent makes a torchelastic_* folder in the temp folder and never removes it:
    # the job gets a private temp folder, removed afterwards (with what the workers left there)
    from course_lib.launcher.launch import server_paused  # no idle rank server beside torchrun
    tmp = tempfile.mkdtemp(prefix="course_lib_torchrun_")
    try:
        with server_paused():
            return _torchrun(target, nprocs, args, max_restarts, timeout, module,
                             {**env, "TMPDIR": tmp}, quiet, allow_shared_loopback)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _torchrun(target: str, nprocs: int, args: Sequence[str], max_restarts: int, timeout: float,
              module: bool, env: dict, quiet: bool, allow_shared: bool) -> TorchrunResult:
    cmd = torchrun_command(target, nprocs, args, max_restarts=max_restarts, module=module)
    threads = str(max(1, devices.cpu_count() // nprocs))
    child_env = {**os.environ, "OMP_NUM_THREADS": threads, **private_run_env(), **env,
                 "PYTHONUNBUFFERED": "1",
                 "COURSE_PROGRESS_CHANNEL": "1"}  # lets progress.report() in ranks reach us
    start = time.monotonic()
    # the same torchrun, its stores listening on 127.0.0.1 only (see _loopback_torchrun), in a
    # private network namespace where the kernel allows one (see _private_net)
    launch = [sys.executable, "-m", "course_lib.launcher._loopback_torchrun", *cmd[3:]]
    proc, shared, _ = _reaper.start(launch, "private" if allow_shared else "private-only",
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=child_env)
    if shared and not allow_shared:  # the reaper started nothing and has ended
        proc.communicate(timeout=30)
        raise SharedLoopbackError(
            f"course_lib.torchrun: the kernel refused a private network namespace here "
            f"({shared}), and {SHARED_LOOPBACK_RISK}. The job was not started. On a machine no one else uses, "
            "pass allow_shared_loopback=True (or set COURSE_ALLOW_SHARED_LOOPBACK=1); on a "
            "shared one, ask for user namespaces (docs/architecture.md, Trust boundary)")
    if shared:
        warn_shared_network(shared)
    lines: list[str] = []
    try:
        name = target if module else os.path.basename(target)
        with progress.watch(f"torchrun {name} on {nprocs} ranks") as view:  # silent outside Jupyter
            _stream(proc, lines, start + timeout, quiet, view)
            code = proc.wait()
    except TimeoutError:
        proc.terminate()
        proc.wait(10)
        raise TimeoutError(f"torchrun did not finish within {timeout:g} s; all its processes "
                           "were stopped") from None
    finally:
        if proc.poll() is None:  # interrupted: closing stdin tells the reaper to kill the tree
            proc.stdin.close()
            proc.terminate()
            proc.wait(10)
        proc.stdin.close()
        proc.stdout.close()
    output = "\n".join(lines)
    if code != 0:
        # torchrun's summary lists other failures first, then "Root Cause (first observed
        # failure)": name the root cause's rank when there is one
        root = output[output.find("Root Cause"):] if "Root Cause" in output else output
        match = re.findall(r"rank\s*:\s*(\d+)", root)
        raise TorchrunError(code, int(match[0]) if match else None, output)
    return TorchrunResult(cmd, output, time.monotonic() - start)


def private_run_env() -> dict:
    """Environment for a local torchrun: a random rendezvous id (``PET_RDZV_ID``).

    torchrun's default id, ``none``, names the key of the pickled rendezvous state
    (``torch.rendezvous.none``); a random one is kept out of the command line (which every local
    user can read in ``/proc``). It is no defence on a shared loopback: ``TCPStore.list_keys()``
    names every key of a store to whoever connects.
    """
    return {"PET_RDZV_ID": f"course_lib_{secrets.token_hex(16)}"}


_WARNED: list[str] = []


def warn_shared_network(reason: str) -> None:
    """Say once per process that a job's stores are reachable by other local users, and why."""
    if _WARNED:
        return
    _WARNED.append(reason)
    warnings.warn(f"course_lib: no private network namespace here ({reason}): torchrun's "
                  f"stores listen on 127.0.0.1, and "
                  f"{SHARED_LOOPBACK_RISK}. Fine on a machine of your own only; see the trust boundary in "
                  "docs/architecture.md", RuntimeWarning, stacklevel=3)


def _stream(proc: subprocess.Popen, lines: list[str], deadline: float, quiet: bool,
            view: progress.View) -> None:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    partial = bytearray()
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        ready = sel.select(timeout=view.wait / 2)
        view.tick()
        if not ready:
            continue
        data = os.read(proc.stdout.fileno(), 1 << 16)
        if data and b"\n" not in data:  # a long line: collect it in place (linear time)
            partial += data
            continue
        *complete, partial = (bytes(partial) + data).split(b"\n") if data else \
            ([bytes(partial)] if partial else []) + [b""]
        partial = bytearray(partial)
        for raw in complete:
            if not raw.strip():
                continue
            match = _PREFIX.match(raw)
            rank = int(match.group(1)) if match else None
            body = raw[match.end() if match else 0:].decode("utf-8", "replace")
            if view.line(rank, body, sys.stdout, echo=not quiet):  # False: a progress report
                lines.append(progress.prefix(rank) + body)
        if not data:
            sel.close()
            return


def init_distributed(backend: str | None = None) -> tuple[int, int]:
    """Join the process group from torchrun's environment; return ``(rank, world_size)``.

    * inside :func:`course_lib.run` (already initialised): nothing to do;
    * under torchrun: connect to the agent's store at ``MASTER_ADDR:MASTER_PORT`` through a
      ``PrefixStore`` named after ``TORCHELASTIC_RESTART_COUNT`` — after a restart, a plain
      ``init_process_group`` finds the previous attempt's keys and fails or hangs
      (seen here 5 times in 6); a fresh namespace per attempt fixed it (8 of 8);
    * no ``RANK`` in the environment: a one-process group, so the same script runs alone.

    It returns only once every rank is connected (a store barrier): gloo's connectFullMesh can
    return on one rank before another, and a rank that then ends at once resets its peer
    mid-handshake ("Gloo connectFullMesh failed" there).
    It also makes the process end with ``os._exit`` once the script is done (exit code 0, or 1
    after an uncaught exception): an ordinary interpreter shutdown with live gloo threads aborts
    with "terminate called without an active exception" in 10-30 % of runs, which torchrun
    reports as a failed rank.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    placement = devices.place(world, backend, None) if world <= devices.max_ranks() else None
    backend = backend or (placement.backend if placement else "gloo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", devices.loopback_interface()
                          if os.environ.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost")
                          else "")
    if not os.environ["GLOO_SOCKET_IFNAME"]:
        del os.environ["GLOO_SOCKET_IFNAME"]
    if "MASTER_ADDR" in os.environ:
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                             is_master=False, timeout=timedelta(seconds=60))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"course_lib/attempt{attempt}", base)
    else:  # alone: an in-memory store (no file left behind)
        store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    if world > 1:  # a store barrier: the last rank to connect lets every rank go
        if store.add("course_lib/connected", 1) == world:
            store.set("course_lib/all_connected", "1")
        store.wait(["course_lib/all_connected"])
    exit_without_finalizing()
    return rank, world


def exit_without_finalizing() -> None:
    """At exit, flush and ``os._exit`` before the interpreter tears down gloo's threads."""
    failed = []
    previous_hook = sys.excepthook

    def hook(*exc_info):
        failed.append(True)
        previous_hook(*exc_info)

    def leave() -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(1 if failed else 0)

    sys.excepthook = hook
    atexit.register(leave)
