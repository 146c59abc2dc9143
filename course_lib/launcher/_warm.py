"""The warm fork server behind :func:`course_lib.run`: one process per kernel, torch imported.

Starting a Python process and importing torch costs ~1-2 s; forking a process that already did
costs a few milliseconds. So the first ``run`` starts this server once, and every rank after that
is ``os.fork()``-ed from it. (The standard library's ``multiprocessing`` forkserver does the same,
but re-imports the parent's ``__main__`` in every child — the Jupyter kernel's launcher — and
cannot run from ``python -``/stdin at all, so the course keeps its own, 150 lines.)

Protocol over a Unix socket pair: the client sends one length-prefixed pickled job per rank, with
the rank's file descriptors attached (stdout, stderr, result, lifeline, exit-status pipes), all
ranks' jobs back to back; the server forks once per job and answers ``(job id, pid)`` for each,
and when it reaps a child writes its exit status into the exit-status pipe. Pids are matched to
jobs by id, never by order; the client sends and reads with Stop held back (see
:mod:`course_lib.launcher.launch`), and after any doubt (an answer out of order, an error half-way) it
kills the server, so a later run starts a fresh one. Each rank leads its own process group: when
the server reaps a rank it kills the rest of that group — whatever the rank started dies with it.
The server exits when its stdin (held by the client) closes: the kernel died.

Forking a ~300 MB process costs ~10-20 ms: its page tables are copied, and most of its memory
is the C heap and Python's objects. Two things make it cheaper: the server's ``malloc`` asks for
transparent huge pages (``glibc.malloc.hugetlb=1``: one page-table entry per 2 MiB of heap
instead of 512; measured ~30 % less CPU per fork and per rank exit on Linux, ignored elsewhere),
and ``gc.freeze()`` once torch is imported, so that the garbage collector of a rank never walks
(and so never copies) the server's objects.
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

_LEN = struct.Struct("!Q")
_ANSWER = struct.Struct("!QQ")  # (job id, pid)
# What every rank would otherwise import again: torch itself, and torch._dynamo, which DDP and
# FSDP import on first use (~1-4 s per process on 2 cores).
_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.distributed.fsdp",
            "torch.nn.parallel", "torch.distributed._tools.mem_tracker", "cloudpickle",
            "course_lib.launcher._worker")


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

    @classmethod
    def start(cls, wait: bool = True) -> "WarmServer":
        """Start a server; ``wait=False`` returns before it has imported torch (the first
        :meth:`fork` then waits for its "ready"), so the caller's own imports run meanwhile."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        code = f"from course_lib.launcher._warm import serve; serve({theirs.fileno()})"
        env = dict(os.environ)
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"),
                                                      "glibc.malloc.hugetlb=1"]))
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        server = cls(proc, ours)
        if wait:
            server.wait_ready()
        return server

    def wait_ready(self) -> None:
        """Wait (once) for the server's "ready": it has imported torch and its preloads."""
        if self.ready:
            return
        self.sock.settimeout(300)  # importing torch on a busy 2-core machine can take a while
        try:
            if _recv_exact(self.sock, 5) != b"ready":
                raise EOFError
        except BaseException as exc:  # also a Stop while waiting: the next call starts afresh
            self.proc.kill()
            if not isinstance(exc, (EOFError, OSError)):
                raise
            raise RuntimeError("the warm server did not start (see the kernel's log for its "
                               "error output)") from exc
        self.sock.settimeout(60)  # no call below may wait forever on a stuck server
        self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None and self.owner_pid == os.getpid()

    def fork(self, jobs: list, fds: list[list[int]], preimport: tuple[str, ...] = ()) -> list[int]:
        """Ask the server to fork one rank per job, running ``_worker.main(job, fds)``; return
        the pids in job order.

        All jobs are sent before the first pid is read, so the server forks back to back (and
        the first ranks start working while it forks the others). ``preimport`` names modules
        the server imports first (once, then cached), so that a function shipped by reference
        does not make every rank import its module again. Whatever interrupts the exchange half
        way (an error, a second Stop) kills the server: its ranks then die through their
        lifelines, and the next call starts a fresh server instead of misreading this one.
        """
        with self.lock:
            self.wait_ready()
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


def serve(fd: int) -> None:
    """Server main loop (runs in the server process)."""
    for name in _PRELOAD:
        __import__(name)
    gc.freeze()  # ranks' garbage collections leave these objects (and their pages) alone

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
