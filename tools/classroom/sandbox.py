"""A throwaway sandbox per submission: its own uid, a cgroup, its own network, mounts and /tmp.

What :class:`Sandbox` gives the process it starts (issue 49), as root on Linux:

- **its own unprivileged uid** (no passwd entry, no groups, ``no_new_privs``): it cannot signal,
  ptrace or read the files of the grader (root), of another submission (another uid) or of the
  teacher (0600 files), and it can write only its own folder and its own ``/tmp``;
- **a cgroup** with a memory limit (no swap), a pids limit and a CPU quota; at the end every
  process in it is killed (``cgroup.kill`` on v2, freeze-kill-thaw on v1), daemons included;
- **a network namespace** whose only interface is its own loopback: a port it listens on exists
  in that namespace only, and dies with it;
- **a mount namespace**: a private ``/tmp`` and ``/dev/shm`` (tmpfs); the course's folder
  (``readonly``) and the interpreter's (its prefixes, site-packages, editable install: wherever
  they live, under ``/tmp`` or a folder others cannot enter, :mod:`tools.classroom.reach`)
  bound back read-only at their own paths, nothing beside them; the folders in ``hide``
  (the submissions, the gradebook's folder) covered by empty read-only tmpfs, and ``/proc``
  remounted with ``hidepid=2`` (no other user's processes or command lines);
- its output goes into a pipe the grader reads with a cap (:meth:`Sandbox.run`), and it gets a
  second pipe (``COURSE_RESULT_FD``) for its result, which nothing it starts inherits.

:func:`why_not` says why a sandbox cannot be made here (not root, no cgroups, no namespaces).
"""
from __future__ import annotations

import ctypes
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from course_lib.launcher._private_net import _loopback_up
from tools.classroom.reach import PRIVATE, plan

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REC, _MS_PRIVATE, _MS_BIND, _MS_REMOUNT = 0x4000, 0x40000, 0x1000, 0x20
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 38, 1
ROOT = Path("/sys/fs/cgroup")
FIRST_UID = 61_000          # sandbox uids: FIRST_UID + n, never a real account here
_SPAWN = threading.Lock()   # one fork at a time: the child runs Python (``_enter``) before exec


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _cgroup_roots() -> dict[str, Path] | None:
    """The folders where this process may make cgroups: one (v2) or one per controller (v1)."""
    if (ROOT / "cgroup.controllers").is_file():
        have = set((ROOT / "cgroup.controllers").read_text().split())
        wanted = {"memory", "pids", "cpu"}
        if not wanted <= have:
            return None
        enabled = set(_read(ROOT / "cgroup.subtree_control").split())
        if not wanted <= enabled and os.geteuid() == 0:  # the root group may enable them
            _try_write(ROOT / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
            enabled = set(_read(ROOT / "cgroup.subtree_control").split())
        return {"v2": ROOT} if wanted <= enabled else None
    roots = {c: ROOT / c for c in ("memory", "pids", "cpu", "freezer")}
    return roots if all((p / "cgroup.procs").is_file() for p in roots.values()) else None


def why_not() -> str | None:
    """Why no sandbox can be made on this machine, or None when it can."""
    if not os.uname().sysname == "Linux":
        return "sandboxes need Linux (namespaces and cgroups)"
    if os.geteuid() != 0:
        return ("the grader is not running as root, so it cannot give each submission its own "
                "user, cgroup and namespaces")
    if _cgroup_roots() is None:
        return "no cgroup with the memory, pids and cpu controllers can be made here"
    libc = _libc()   # loaded before the fork: the child only calls into it
    with _SPAWN:     # (grade_folder's threads fork too)
        pid = os.fork()
        if pid == 0:  # try the namespaces in a throwaway child
            os._exit(0 if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "the kernel refuses new mount and network namespaces here"
    return None


class Sandbox:
    """One submission's sandbox: ``run`` a command in it, ``close`` kills all and removes it."""

    def __init__(self, uid: int, *, memory: int = 2 << 30, pids: int = 512, cpus: float = 1.0,
                 hide: Sequence[str | os.PathLike] = (),  # network=False: the host's (tests)
                 readonly: Sequence[str | os.PathLike] = (), network: bool = True) -> None:
        self.uid, self.network = uid, network
        self.readonly = [os.path.abspath(r) for r in readonly]
        self.hide = [os.path.abspath(h) for h in hide]
        self.reach = plan(self.readonly)   # computed here: the child only mounts
        self.home = tempfile.mkdtemp(prefix=f"course-sandbox-{uid}-")
        os.chown(self.home, uid, uid)
        os.chmod(self.home, 0o700)
        name = f"course_grade_{os.getpid()}_{uid}"
        self.groups: list[Path] = []
        roots = _cgroup_roots()
        if roots is None:
            raise RuntimeError("no cgroup can be made here")
        for kind, root in roots.items():
            group = root / name
            group.mkdir(exist_ok=True)
            self.groups.append(group)
            period = 100_000
            if kind == "v2":
                (group / "memory.max").write_text(str(memory))
                _try_write(group / "memory.swap.max", "0")
                (group / "pids.max").write_text(str(pids))
                (group / "cpu.max").write_text(f"{int(cpus * period)} {period}")
            elif kind == "memory":
                (group / "memory.limit_in_bytes").write_text(str(memory))
                _try_write(group / "memory.memsw.limit_in_bytes", str(memory))
            elif kind == "pids":
                (group / "pids.max").write_text(str(pids))
            elif kind == "cpu":
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))

    # -- in the child, between fork and exec: no threads, no Python objects shared ---------------
    def _enter(self, result_fd: int) -> None:
        libc = _libc()
        for group in self.groups:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if libc.unshare(CLONE_NEWNS | (CLONE_NEWNET if self.network else 0)) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        _mount(libc, b"none", b"/", None, _MS_REC | _MS_PRIVATE)
        # the interpreter's folders and the course's, held open before /tmp and the closed
        # folders above them are covered, then bound back read-only at their own paths (reach.py)
        held = [(os.open(t, os.O_PATH), t) for t in self.reach.targets]
        for where in PRIVATE:
            if os.path.isdir(where):
                _mount(libc, b"tmpfs", where.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                       b"mode=1777,size=512m")
        for closed in self.reach.covers:
            _mount(libc, b"tmpfs", closed.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                   b"mode=0755,size=64k")
        umask = os.umask(0o022)   # the folders made on the way: others may enter them
        for fd, target in held:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.makedirs(target, exist_ok=True)
            elif not os.path.exists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
            _mount(libc, f"/proc/self/fd/{fd}".encode(), target.encode(), None,
                   _MS_BIND | _MS_REC)
            _mount(libc, b"none", target.encode(), None,
                   _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
            os.close(fd)
        os.umask(umask)
        for path in self.hide:  # last: also over what a bind above brought back
            if os.path.isdir(path):
                _mount(libc, b"tmpfs", path.encode(), b"tmpfs",
                       _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, b"mode=0,size=4k")
        try:  # other users' processes and command lines out of sight
            _mount(libc, b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                   b"hidepid=2")
        except OSError:
            pass
        if self.network:
            _loopback_up()
        os.setgroups([])
        os.setresgid(self.uid, self.uid, self.uid)
        os.setresuid(self.uid, self.uid, self.uid)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

    def run(self, argv: list[str], *, env: dict, stdin: bytes, timeout: float,
            output_cap: int, result_cap: int = 4 << 20) -> dict:
        """Run ``argv`` in the sandbox; returns ``{"code", "output", "result", "limit"}``:
        the first ``output_cap`` bytes of its output, its result pipe's bytes (bytes), the limit hit."""
        read, write = os.pipe()
        os.set_inheritable(write, True)
        with _SPAWN:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, cwd=self.home,
                                    env={**env, "HOME": self.home, "TMPDIR": "/tmp",
                                         "COURSE_RESULT_FD": str(write)},
                                    preexec_fn=lambda: self._enter(write), pass_fds=(write,))
            os.close(write)
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        out, result, limit = bytearray(), bytearray(), None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(read, selectors.EVENT_READ, "result")
        deadline, open_, ended = time.monotonic() + timeout, 2, None
        while open_:
            left = deadline - time.monotonic()
            if left <= 0:
                limit = "time"
                break
            if ended is None and proc.poll() is not None:
                ended = time.monotonic()  # what it started may hold its pipes: drain, then go
            if ended is not None and time.monotonic() - ended > 1.0:
                break
            for key, _ in sel.select(timeout=min(left, 0.2 if ended else 1.0)):
                fd = key.fd
                data = os.read(fd, 1 << 16)
                if not data:
                    sel.unregister(fd)
                    open_ -= 1
                    continue
                buf, cap = (out, output_cap) if key.data == "out" else (result, result_cap)
                buf += data[:max(0, cap - len(buf))]
                if len(buf) >= cap and len(data) > 0 and key.data == "out" and \
                        len(out) >= output_cap:
                    limit = limit or "output"
                if key.data == "result" and len(result) >= result_cap:
                    limit = limit or "result"
            if limit in ("output", "result"):
                break
        sel.close()
        os.close(read)
        self.kill_all()
        proc.stdout.close()
        code = proc.wait()
        return {"code": code, "output": bytes(out), "result": bytes(result), "limit": limit}

    def kill_all(self) -> None:
        """Kill every process in the sandbox's cgroup (what it started, daemons included)."""
        procs = [g / "cgroup.procs" for g in self.groups]
        if self.groups and self.groups[0].parent == ROOT:  # v2
            if _try_write(self.groups[0] / "cgroup.kill", "1"):
                _wait_empty(procs)
                return
        freezer = [g for g in self.groups if g.parent.name == "freezer"]
        for _ in range(20):
            for g in freezer:
                _try_write(g / "freezer.state", "FROZEN")
            pids = {int(p) for f in procs for p in _read(f).split()}
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for g in freezer:
                _try_write(g / "freezer.state", "THAWED")
            if not pids or _wait_empty(procs, 2.0):
                return

    def close(self) -> None:
        self.kill_all()
        for group in self.groups:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
        if self.home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sweep_stale() -> int:
    """Kill and remove the sandboxes of graders that died without closing them; their count."""
    roots = _cgroup_roots() or {}
    stale: dict[str, list[Path]] = {}
    for root in roots.values():
        for group in root.glob("course_grade_*_*"):
            owner = group.name.split("_")[2]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                stale.setdefault(group.name, []).append(group)
    for groups in stale.values():
        box = Sandbox.__new__(Sandbox)
        box.groups, box.home = groups, None
        box.kill_all()
        for group in groups:
            try:
                group.rmdir()
            except OSError:
                pass
    return len(stale)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _try_write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
        return True
    except OSError:
        return False


def _wait_empty(procs: list[Path], seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(_read(p).split() for p in procs):
            return True
        time.sleep(0.02)
    return False


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    if libc.mount(source, target, fstype, flags, data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target!r}: {os.strerror(errno)}")


