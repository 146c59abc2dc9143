"""Beyond one machine: two torchrun agents as two "nodes", on loopback or behind a slow link.

Chapter 5 runs :mod:`course_lib.communication.train_ddp` — a script that runs unchanged under one
process or torchrun — the way a cluster does: one torchrun agent per node, ``--nnodes 2
--node-rank 0/1``, meeting at a c10d rendezvous on node 0. Here both "nodes" are on this
machine, on the loopback of a private network namespace (127.0.0.1, a free port; where the
kernel refuses one, only with ``allow_shared_loopback=True``, as :func:`course_lib.torchrun`).
:func:`two_namespaces` (root) joins two namespaces by a veth pair that ``tc`` can throttle.
Each agent runs under :mod:`course_lib.launcher._reaper` (a timeout or an error leaves no
process behind), with the warm rank server paused (they import torch themselves).
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from course_lib.common.checks import positive_int
from course_lib.launcher import devices, netns
from course_lib.launcher.launch import server_paused
from course_lib.launcher.torchrun import (ALLOW_SHARED_LOOPBACK, SHARED_LOOPBACK_RISK,
                                          SharedLoopbackError, private_run_env,
                                          shared_loopback_allowed, start_reaped,
                                          torchrun_command, warn_shared_network, worker_mode)

__all__ = ["SCRIPT", "NodesResult", "free_port", "two_node_commands", "run_two_nodes",
           "reference_params", "netns_available", "two_namespaces"]

#: The chapter's worker script (runs as ``python SCRIPT`` or under torchrun).
SCRIPT = str(Path(__file__).parent / "train_ddp.py")


@dataclass(frozen=True)
class NodesResult:
    """Output of each node (agent and its workers, torchrun-prefixed) and the wall time."""

    commands: list[list[str]]
    outputs: list[str]
    seconds: float


def reference_params(args: Sequence[str] = (), script: str = SCRIPT) -> dict:
    """The parameters one plain process (no DDP) reaches with the script's ``args``: the
    script's own ``train_reference``, run here, in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_lib_train_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    opts = module.parse_args([str(a) for a in args])
    return module.train_reference(opts.sizes, opts.global_batch, opts.steps, opts.lr, opts.seed)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on ``host`` right now (never a hard-coded one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def two_node_commands(script: str, nprocs_per_node: int, args: Sequence[str],
                      port: int) -> list[list[str]]:
    """The torchrun argv of node 0 and node 1 on 127.0.0.1; node 0 hosts the rendezvous."""
    commands = []
    for node in range(2):
        cmd = torchrun_command(script, nprocs_per_node, args, nnodes=2, node_rank=node,
                               endpoint=f"127.0.0.1:{port}")
        at, host = cmd.index(script), f"--rdzv-conf=is_host={int(node == 0)}"  # said explicitly
        commands.append(cmd[:at] + [host] + cmd[at:])
    return commands


def _launch(argv: list[str], env: dict,
            net: str | None = None) -> tuple[subprocess.Popen, str | None, int | None]:
    """``argv`` under the reaper: :func:`course_lib.launcher.torchrun.start_reaped`'s triple."""
    return start_reaped(argv, net, (), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, env=env)


def _collect(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Read every process's output (threads: no pipe fills up) until all exit or time is up."""
    chunks: list[list[bytes]] = [[] for _ in procs]
    readers = [threading.Thread(target=lambda p=p, c=c: c.extend(iter(p.stdout.readline, b"")),
                                daemon=True) for p, c in zip(procs, chunks)]
    for reader in readers:
        reader.start()
    deadline, late = time.monotonic() + timeout, False
    try:
        for proc in procs:
            proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        late = True
    finally:
        for proc in procs:
            if proc.poll() is None:  # the reaper kills its whole tree on SIGTERM
                proc.terminate()
                proc.wait(10)
            proc.stdin.close()
        for proc, reader in zip(procs, readers):
            reader.join(5)
            if not reader.is_alive():
                proc.stdout.close()
    outputs = [b"".join(c).decode("utf-8", "replace") for c in chunks]
    if late:
        tails = "".join(f"\n--- node {n} ---\n" + "\n".join(text.splitlines()[-8:])
                        for n, text in enumerate(outputs))
        raise TimeoutError(f"the nodes did not finish within {timeout:g} s; all their "
                           f"processes were stopped{tails}")
    return outputs


def _check(procs: list[subprocess.Popen], outputs: list[str], what: str) -> None:
    for node, (proc, text) in enumerate(zip(procs, outputs)):  # first failure wins
        if proc.returncode != 0:
            tail = "\n".join(text.rstrip().splitlines()[-15:])
            raise RuntimeError(f"{what}: node {node} exited with code {proc.returncode}\n{tail}")


def _validate(nprocs_per_node: int, script: str, timeout: float) -> None:
    positive_int(nprocs_per_node, "nprocs_per_node")
    if not os.path.isfile(script):
        raise FileNotFoundError(f"no script {script!r}")
    devices.validate_timeout(timeout)


def run_two_nodes(script: str = SCRIPT, nprocs_per_node: int = 1, args: Sequence[str] = (),
                  timeout: float = 120.0, *,
                  allow_shared_loopback: bool | None = None) -> NodesResult:
    """Run ``script`` as 2 nodes x ``nprocs_per_node`` ranks: two torchrun agents on loopback.

    Node 0's agent gets a private network namespace and node 1's joins it. Where the kernel
    refuses one, it raises :class:`~course_lib.launcher.torchrun.SharedLoopbackError` before any
    agent starts, unless ``allow_shared_loopback=True`` (or ``COURSE_ALLOW_SHARED_LOOPBACK=1``):
    then it warns and runs on the host's loopback, open to every local user.
    """
    _validate(nprocs_per_node, script, timeout)
    allow_shared_loopback = shared_loopback_allowed(allow_shared_loopback)
    commands = two_node_commands(script, nprocs_per_node, [str(a) for a in args], free_port())
    threads = max(1, devices.usable_cores() // (2 * nprocs_per_node))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
           "COURSE_TORCHRUN_WORKERS": worker_mode(),  # forked in a pod (issue 50)
           **private_run_env()}  # one random rendezvous id for both agents
    # the same torchrun, stores on 127.0.0.1 only, no interpreter teardown (_loopback_torchrun)
    argv = [[sys.executable, "-m", "course_lib.launcher._loopback_torchrun", *cmd[3:]]
            for cmd in commands]
    with server_paused():  # 2 agents and their workers import torch: no idle server beside them
        start = time.monotonic()
        first, shared, inside = _launch(argv[0], env, net="private" if allow_shared_loopback
                                        else "private-only")
        if shared and not allow_shared_loopback:  # the reaper started nothing and has ended
            first.communicate(timeout=30)
            raise SharedLoopbackError(
                f"run_two_nodes: the kernel refused a private network namespace here ({shared}),"
                f" and {SHARED_LOOPBACK_RISK}. No node was started. On a machine no one else uses, pass "
                f"allow_shared_loopback=True (or set {ALLOW_SHARED_LOOPBACK}=1)")
        procs = [first]
        try:
            if shared:
                warn_shared_network(shared)
            procs.append(_launch(argv[1], env, net=None if shared else f"join:{inside}")[0])
        finally:
            if len(procs) < 2:  # node 1 could not start: node 0 would wait for it in vain
                first.terminate()
                first.wait(10)
        outputs = _collect(procs, timeout)
    _check(procs, outputs, "two-node run")
    return NodesResult(commands, outputs, time.monotonic() - start)


def netns_available() -> tuple[bool, str]:
    """Whether this process may create named network namespaces and shape traffic; and why not."""
    mode, why = netns.availability()
    if mode is not None and mode != "root":
        return False, "creating named network namespaces needs root"
    return mode is not None, why


@contextlib.contextmanager
def two_namespaces(rate_mbit: float | None = None) -> Iterator[list[tuple[str, str, str]]]:
    """Two namespaces joined by a veth pair; yields ``[(namespace, interface, address)] * 2``.

    ``rate_mbit`` throttles both ends with a token-bucket filter (``tc qdisc ... tbf``).
    Addresses 10.99.0.1/2 exist only inside these namespaces; everything is deleted on exit
    (:func:`course_lib.launcher.netns.named_pair`).
    """
    ok, why = netns_available()
    if not ok:
        raise netns.LinkUnavailable(why)
    if rate_mbit is not None and rate_mbit <= 0:
        raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
    with netns.named_pair(f"5p{os.getpid()}", rate_mbit or 0.0) as nodes:
        yield nodes
