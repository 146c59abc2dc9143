"""The warm fork server behind :func:`course_lib.run`: one process per kernel, torch imported.

Importing torch costs seconds per process, forking a process that already did milliseconds: every
rank is ``os.fork()``-ed from this server. Over a Unix socket pair the client sends one
length-prefixed pickled job per rank with the rank's pipes attached as file descriptors; the
server forks once per job, answers ``(job id, pid)``, and when it reaps a child writes its exit
status into the rank's exit-status pipe and kills the rest of that rank's process group. Pids are
matched to jobs by id; after any doubt the client kills the server and the next run starts a
fresh one. The server exits when its stdin closes (the kernel died). Why not multiprocessing's
forkserver, and what makes a fork cheaper here: docs/modules/launcher.md (_warm.py).
"""
from __future__ import annotations

import gc
import importlib
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import types
from typing import Any, Callable, Iterable

_LEN = struct.Struct("!Q")
_ANSWER = struct.Struct("!QQ")  # (job id, pid)
# What every rank would otherwise import again: torch itself, and torch._dynamo, which DDP, FSDP
# and a torch optimizer's first step import (~1-4 s per process on 2 cores), and chapter 01's
# memory tracker (rank functions import it: in a kernel it would pull torch._dynamo in).
_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.distributed.fsdp",
            "torch.nn.parallel", "torch.distributed._tools.mem_tracker", "cloudpickle",
            "course_lib.launcher._worker", "course_lib.memory.tracker")
# malloc's settings in the server, and so in every rank it forks: transparent huge pages for the
# heap (fewer page-table entries to copy per fork) and one arena (each gloo thread of a rank
# would grow an arena of its own; docs/modules/launcher.md)
_TUNABLES = "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1"


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("warm server connection closed")
        buf += chunk
    return bytes(buf)


class WarmServer:
    """Client handle on a running server process (start with :meth:`start`)."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket):
        self.proc, self.sock, self.owner_pid = proc, sock, os.getpid()
        self.lock = threading.Lock()
        self.next_id = 0
        self.ready = False
        self._greeting = b""  # what arrived of b"ready" so far (a Stop may cut the wait short)

    @classmethod
    def start(cls, wait: bool = True) -> "WarmServer":
        """Start the server process; with ``wait=False`` return while it still imports torch
        (:meth:`wait_ready` before the first :meth:`fork`), so the caller's own imports overlap
        with the server's on a second core."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        code = f"from course_lib.launcher._warm import serve; serve({theirs.fileno()})"
        env = dict(os.environ)
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), _TUNABLES]))
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        server = cls(proc, ours)
        if wait:
            server.wait_ready()
        return server

    def wait_ready(self) -> None:
        """Block until the server has imported torch and answered ``ready`` (once)."""
        if self.ready:
            return
        self.sock.settimeout(300)  # importing torch on a busy 2-core machine can take a while
        try:
            while len(self._greeting) < 5:
                chunk = self.sock.recv(5 - len(self._greeting))
                if not chunk:
                    raise EOFError("warm server connection closed")
                self._greeting += chunk
            if self._greeting != b"ready":
                raise EOFError(f"unexpected greeting {self._greeting!r}")
        except (EOFError, OSError) as exc:
            self.proc.kill()
            raise RuntimeError("the warm server did not start (see the kernel's log for its "
                               "error output)") from exc
        self.sock.settimeout(60)  # no call below may wait forever on a stuck server
        self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None and self.owner_pid == os.getpid()

    def close(self, grace: float = 5.0) -> None:
        """End the server: close its lifeline (it exits at once), kill it if it has not after
        ``grace`` seconds, and reap it. Its ranks are gone by then (no run holds it)."""
        try:
            self.sock.close()
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=grace)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()

    def fork(self, jobs: list, fds: list[list[int]], preimport: tuple[str, ...] = ()) -> list[int]:
        """Ask the server to fork one rank per job, running ``_worker.main(job, fds)``; return
        the pids in job order.

        All jobs are sent before the first pid is read, so the server forks back to back (and
        the first ranks start working while it forks the others). ``preimport`` names modules
        the server imports first (once, then cached; see :func:`preimports_of`), so that no
        rank imports them again. Whatever interrupts the exchange half
        way (an error, a second Stop) kills the server: its ranks then die through their
        lifelines, and the next call starts a fresh server instead of misreading this one.
        """
        self.wait_ready()
        with self.lock:
            first = self.next_id
            self.next_id += len(jobs)
            try:
                for job_id, job, job_fds in zip(range(first, self.next_id), jobs, fds):
                    blob = pickle.dumps((job_id, preimport, sys.path, job))
                    socket.send_fds(self.sock, [_LEN.pack(len(blob))], job_fds)
                    self.sock.sendall(blob)
                answers = [_ANSWER.unpack(_recv_exact(self.sock, _ANSWER.size)) for _ in jobs]
                if [job_id for job_id, _ in answers] != list(range(first, self.next_id)):
                    raise EOFError(f"answers out of order: {answers}")
            except BaseException as exc:
                self.proc.kill()  # a broken or doubtful server is replaced on the next call
                if not isinstance(exc, (OSError, EOFError)):  # socket.timeout is an OSError
                    raise
                raise RuntimeError(f"the warm server stopped answering ({exc}); run again to "
                                   "start a fresh one") from exc
        return [pid for _, pid in answers]


def preload(names: Iterable[str] = _PRELOAD) -> None:
    """Import ``names`` once, then freeze every object so far (``gc.freeze``): processes forked
    from this one share those pages, and their garbage collections leave them alone. The warm
    server, torchrun's agent in a pod and the shaped link's hub call it before they fork."""
    for name in names:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()


def serve(fd: int) -> None:
    """Server main loop (runs in the server process)."""
    preload()

    sock = socket.socket(fileno=fd)
    status_pipes: dict[int, int] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook interrupt is the client's business
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "job")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "lifeline")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    try:
        sock.sendall(b"ready")
    except OSError:  # the client is gone already
        os._exit(0)
    while True:
        for key, _ in sel.select():
            if key.data == "lifeline":
                if not os.read(sys.stdin.fileno(), 1):
                    os._exit(0)
            elif key.data == "child":
                os.read(wake_r, 4096)
                _reap(status_pipes)
            else:
                _fork_one(sock, status_pipes, (sel, sock, wake_r, wake_w))


def _fork_one(sock: socket.socket, status_pipes: dict[int, int], own: tuple) -> None:
    """Read one job, fork its rank (leader of a new process group), answer ``(job id, pid)``."""
    fds: list[int] = []
    try:
        header, fds, _, _ = socket.recv_fds(sock, _LEN.size, 8)
        if not header:
            os._exit(0)
        header += _recv_exact(sock, _LEN.size - len(header))
        job_id, preimport, sys_path, job = pickle.loads(_recv_exact(sock, _LEN.unpack(header)[0]))
        if len(fds) != 5:
            raise EOFError(f"a job came with {len(fds)} file descriptors instead of 5")
    except BaseException:  # noqa: BLE001 - out of step with the client: it starts a fresh server
        os._exit(0)
    _preimport(preimport, sys_path)
    pid = os.fork()
    if pid == 0:  # the rank
        try:
            os.setpgid(0, 0)
            sel, sock, wake_r, wake_w = own
            sel.close()
            sock.close()
            for f in (wake_r, wake_w, *status_pipes.values(), fds[-1]):
                os.close(f)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            from course_lib.launcher import _worker  # preloaded by serve(): no import happens here
            _worker.main(job, fds[:-1])
        finally:
            os._exit(70)
    try:
        os.setpgid(pid, pid)  # also here: no race with a kill sent before the child ran
    except OSError:
        pass
    status_pipes[pid] = fds[-1]
    for f in fds[:-1]:
        os.close(f)
    sock.sendall(_ANSWER.pack(job_id, pid))
    _reap(status_pipes)


def preimports_of(fn: Callable[..., Any]) -> tuple[str, ...]:
    """Modules the warm server should import once, before forking, so no rank imports them.

    For a by-reference function: its module. For a notebook function (shipped by value): the
    ``course_lib`` modules of the globals its code names (``train_rank``, ``zero``...), which
    unpickling would otherwise import in every rank (~0.1-1 s of CPU each). Then the modules
    named in the function's ``preimport`` attribute: a heavy library that only the ranks use, so
    that the notebook's process never imports it (chapter 4's megatron-core)."""
    extra = tuple(getattr(fn, "preimport", ()))
    return tuple(dict.fromkeys(_own_modules(fn) + extra))


def _own_modules(fn: Callable[..., Any]) -> tuple[str, ...]:
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name or "")
    if name not in (None, "__main__") and getattr(module, "__file__", None):
        return (name,)
    code, namespace = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    if code is None or not isinstance(namespace, dict):
        return ()
    names, codes = set(), [code]
    while codes:  # the function and the functions, lambdas and classes defined inside it
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    found = []
    for value in (namespace[n] for n in sorted(names) if n in namespace):
        used = value.__name__ if isinstance(value, types.ModuleType) else \
            getattr(value, "__module__", None)
        if isinstance(used, str) and used.startswith("course_lib.") and used not in found \
                and getattr(sys.modules.get(used), "__file__", None):
            found.append(used)
    return tuple(found)


def _preimport(names: tuple[str, ...], sys_path: list[str]) -> None:
    """Import modules into the server so forked ranks inherit them (errors: left to the rank)."""
    missing = [n for n in names if n not in sys.modules]
    if not missing:
        return
    sys.path[:] = sys_path
    for name in missing:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - the rank will hit and report the same error
            pass
    gc.freeze()


def _reap(status_pipes: dict[int, int]) -> None:
    """Collect ended children; tell each one's client its exit status (negative = signal)."""
    while status_pipes:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_pipes.pop(pid, None)
        try:
            os.killpg(pid, signal.SIGKILL)  # what the rank started: it must not outlive it
        except OSError:  # nothing left in the group
            pass
        if fd is not None:
            code = os.waitstatus_to_exitcode(status)
            try:
                os.write(fd, struct.pack("!q", code))
            except OSError:
                pass
            os.close(fd)
