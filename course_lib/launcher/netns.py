"""A shaped link between two processes: network namespaces, a veth pair, ``tc`` (ch. 02, 05, 11).

Two "nodes" (processes), each in a network namespace of its own, joined by a veth pair
(10.99.0.1 and 10.99.0.2, jumbo frames) whose both ends ``tc`` shapes: a token bucket
(``tbf``) for a rate, ``netem`` for a delay. gloo between them then pays real wire time for
every byte, which compute can overlap (the CPU is free while a socket waits). The hub that
makes the nodes, wires the veth and drives them (JSON lines) is
:mod:`course_lib.launcher.shaped_link`, the course's one; as root, :func:`named_pair` names two
such namespaces for ``ip netns exec`` (chapter 05's torchrun nodes). :func:`availability` says
whether namespaces can be made here (root, or a user namespace where the kernel allows one).
Hub and nodes die with their parent (``PR_SET_PDEATHSIG``); a namespace vanishes with its node.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from functools import partial
from typing import Callable, Iterator

import psutil

from course_lib.launcher._forked_workers import ForkedCall
from course_lib.launcher._private_net import CLONE_NEWNET, _check, _libc
from course_lib.launcher._private_net import Refused as PrivateNetRefused, enter as enter_private

__all__ = ["ADDRS", "LinkUnavailable", "availability", "die_with_parent", "tx_bytes", "shape",
           "Nodes", "wire", "named_pair", "MTU", "enter_private", "PrivateNetRefused"]

_PR_SET_PDEATHSIG = 1
ADDRS = ("10.99.0.1", "10.99.0.2")
#: Jumbo frames, as datacenter Ethernet uses: at 1500 bytes the kernel's per-packet work (both
#: TCP stacks run on these same cores) took ~40 % of a core during a 500 Mbit/s all-reduce, so
#: the "wire-bound" communication was CPU-bound too (docs/decisions/communication.md, "Why the
#: shaped link uses jumbo frames").
MTU = 9000


class LinkUnavailable(RuntimeError):
    """The two-node network cannot be built here; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"cannot build the two-node network here: {reason}")
        self.reason = reason


def _in_new_net(node: Callable[[], None]) -> None:
    """In a forked child: a network namespace of its own (as ``unshare --net``), then ``node()``."""
    _check(_libc().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    node()


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when the parent process exits (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def tx_bytes(iface: str) -> int:
    """Bytes sent by ``iface`` of this process's network namespace (``/proc/net/dev``)."""
    counters = psutil.net_io_counters(pernic=True, nowrap=False)
    if iface not in counters:
        raise LookupError(f"no interface {iface!r} in /proc/net/dev")
    return counters[iface].bytes_sent


def _tools_env() -> dict:
    """This environment with ``/usr/sbin`` and ``/sbin`` at the end of ``PATH``: Debian keeps
    ``tc`` there, and a normal user's ``PATH`` leaves them out (root's has them)."""
    path = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p]
    return {**os.environ, "PATH": os.pathsep.join(
        path + [d for d in ("/usr/sbin", "/sbin") if d not in path])}


def _probe(prefix_: list[str], *argv: str) -> str | None:
    """Run ``argv`` under ``prefix_``; None when it worked, else its error text."""
    try:
        done = subprocess.run([*prefix_, *argv], capture_output=True, text=True, timeout=20,
                              env=_tools_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def availability(latency: bool = False) -> tuple[str | None, str]:
    """``(mode, reason)``: mode ``"root"``, ``"user namespace"`` or None (then ``reason`` says why).

    Probes for real: a veth pair made inside a fresh network namespace (and, with ``latency``,
    a ``netem`` qdisc — a kernel option some machines leave out).
    """
    if not sys.platform.startswith("linux"):
        return None, "network namespaces are Linux-only"
    path = _tools_env()["PATH"]
    missing = [t for t in ("ip", "tc", "unshare", "nsenter") if shutil.which(t, path=path) is None]
    if missing:
        return None, f"{', '.join(missing)} not found (apt-get install iproute2 util-linux)"
    mode = "root" if os.geteuid() == 0 else "user namespace"
    unshare = ["unshare", *(["--user", "--map-root-user"] if mode != "root" else []), "--net"]
    error = _probe(unshare, "ip", "link", "add", "name", "clprobe0", "type", "veth", "peer",
                   "name", "clprobe1")
    if error:
        why = ("'unshare --net' was refused" if mode == "root" else
               "unprivileged user namespaces are off here (unshare --user --map-root-user --net)")
        return None, f"{why}: {error}"
    if latency and _probe(unshare, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                          "delay", "1ms"):
        return None, ("the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), needed for a delay; "
                      "use latency_ms=0")
    return mode, "ok"


def _sh(*argv: str, check: bool = True) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env=_tools_env())
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def _in(ns: int | str, *argv: str, check: bool = True) -> None:
    """Run ``argv`` in the network namespace of process ``ns`` (a pid) or named ``ns``."""
    where = f"/proc/{ns}/ns/net" if isinstance(ns, int) else f"/run/netns/{ns}"
    _sh("nsenter", f"--net={where}", *argv, check=check)


def shape(ns: int | str, iface: str, rate_mbit: float, latency_ms: float = 0.0) -> None:
    """Replace the root qdisc of ``iface`` in namespace ``ns`` (a pid or a name): tbf for a rate,
    netem for a delay (and its rate)."""
    _in(ns, "tc", "qdisc", "del", "dev", iface, "root", check=False)  # none there yet: fine
    if latency_ms > 0:
        rate = ["rate", f"{rate_mbit}mbit"] if rate_mbit else []
        _in(ns, "tc", "qdisc", "add", "dev", iface, "root", "netem", "delay",
            f"{latency_ms}ms", *rate, "limit", "100000")
    elif rate_mbit:
        burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 / 1000))  # >= 1 ms of traffic
        _in(ns, "tc", "qdisc", "add", "dev", iface, "root", "tbf", "rate", f"{rate_mbit}mbit",
            "burst", str(burst), "latency", "1s")


def wire(namespaces: list[int | str], tag: int) -> list[str]:
    """Join two namespaces (node processes' pids, or names) by a veth pair; its two ends."""
    ifaces = [f"clv{i}p{tag}"[:15] for i in range(2)]
    _sh("ip", "link", "add", "name", ifaces[0], "type", "veth", "peer", "name", ifaces[1])
    for ns, iface, addr in zip(namespaces, ifaces, ADDRS):
        _sh("ip", "link", "set", iface, "netns", str(ns))
        _in(ns, "ip", "addr", "add", f"{addr}/24", "dev", iface)
        _in(ns, "ip", "link", "set", iface, "mtu", str(MTU), "up")
        _in(ns, "ip", "link", "set", "lo", "up")
    return ifaces


@contextlib.contextmanager
def named_pair(tag: str, rate_mbit: float = 0.0) -> Iterator[list[tuple[str, str, str]]]:
    """As root: two namespaces named ``cl{tag}n0/1`` (``ip netns add``, for ``ip netns exec``)
    joined by :func:`wire`, both ends :func:`shape`-d to ``rate_mbit`` (0: unthrottled); yields
    ``[(name, interface, address)] * 2``. Names, namespaces and the veth pair are gone on exit."""
    names: list[str] = []
    try:
        for i in range(2):
            _sh("ip", "netns", "add", f"cl{tag}n{i}")
            names.append(f"cl{tag}n{i}")
        ifaces = wire(names, os.getpid())
        for name, iface in zip(names, ifaces):
            shape(name, iface, rate_mbit)
        yield list(zip(names, ifaces, ADDRS))
    finally:  # a namespace gone, its veth end goes too
        for name in names:
            _sh("ip", "netns", "del", name, check=False)


class Nodes:
    """The two node processes (``python -m module node``, each under ``unshare --net``, or
    ``node()`` in a fork of this process that enters a new network namespace): JSON lines in,
    JSON lines out, stderr kept in temp files.

    One reader thread per node: when a node dies, the hub learns it at once (its peer would
    wait in a collective), and the error names the node and shows its traceback.
    """

    def __init__(self, module: str, node: Callable[[], None] | None = None) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.errs = [tempfile.TemporaryFile("w+") for _ in range(2)]
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "env": env}
        if node is not None:  # forked from this process, each in a network namespace of its own
            self.procs = [ForkedCall(partial(_in_new_net, node), stderr=err, **pipes)
                          for err in self.errs]
        else:
            self.procs = [subprocess.Popen(["unshare", "--net", sys.executable, "-m", module,
                                            "node"], stderr=err, **pipes) for err in self.errs]
        self.lines: queue.Queue = queue.Queue()
        for rank, proc in enumerate(self.procs):
            threading.Thread(target=self._pump, args=(rank, proc), daemon=True).start()

    def _pump(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.put((rank, line))
        self.lines.put((rank, None))

    def send(self, rank: int, job: dict) -> None:
        print(json.dumps(job), file=self.procs[rank].stdin, flush=True)

    def receive(self) -> list[dict]:
        """One JSON line from each node, in rank order; a node that exits raises."""
        got: dict[int, dict] = {}
        while len(got) < 2:
            rank, line = self.lines.get()
            if line is None:
                code = self.procs[rank].wait()
                self.errs[rank].seek(0)
                tail = "\n".join(self.errs[rank].read().rstrip().splitlines()[-25:])
                raise RuntimeError(f"node {rank} exited with code {code}:\n{tail}")
            got[rank] = json.loads(line)
        return [got[0], got[1]]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for err in self.errs:
            err.close()
