"""A private network namespace for a local torchrun job: its stores reachable by no other user.

torchrun's agent hosts unauthenticated TCPStores, one holding the rendezvous state, a pickle the
agent loads every monitor tick: on 127.0.0.1 any local user could run code as the learner.
:func:`enter` moves the calling process, and all it starts afterwards, into a fresh network
namespace whose only interface is its own loopback (as root ``unshare(CLONE_NEWNET)``, otherwise
inside a user namespace that maps the user to itself), plus a private mount namespace whose
``/etc/hosts`` names ``::ffff:127.0.0.1``. :func:`join` enters another process's namespaces
(chapter 5's second "node"). Both must run in a single-threaded process: the reaper calls them
in its child, between fork and exec. docs/architecture.md, "Trust boundary", has the model.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import sys
import tempfile
from pathlib import Path

CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWNS = 0x40000000, 0x10000000, 0x00020000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_HOSTS = "\n# course_lib: private network namespace\n::1 localhost\n::ffff:127.0.0.1 localhost\n"


class Refused(OSError):
    """The kernel refused a new namespace; this process is unchanged (it may go on without)."""


def _libc() -> ctypes.CDLL:
    if not sys.platform.startswith("linux"):
        raise Refused("network namespaces are Linux-only")
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str, error: type[OSError] = OSError) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise error(errno, f"{what}: {os.strerror(errno)}")


def _loopback_up() -> None:
    """Bring up ``lo`` (a new namespace's loopback starts down; 127.0.0.1 comes with it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)  # struct ifreq: name, flags, padding to 40
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))


def _private_hosts(libc: ctypes.CDLL) -> None:
    """Bind a copy of ``/etc/hosts`` naming the loopback's IPv6 forms over it, in this mount
    namespace only (made private first: nothing propagates back to the machine's)."""
    _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    hosts = Path("/etc/hosts").read_text()
    # 0700, ours alone; removed after the mount, which keeps the file's content
    with tempfile.TemporaryDirectory(prefix="course_lib_hosts_") as folder:
        path = Path(folder, "hosts")
        path.write_text(hosts + _HOSTS)
        _check(libc.mount(str(path).encode(), b"/etc/hosts", None, _MS_BIND, None),
               "bind-mount /etc/hosts")


def enter(as_root: bool = False) -> str:
    """Move this process into fresh network and mount namespaces; ``"root"`` or ``"user namespace"``.

    ``as_root``: in a user namespace, map the user to root rather than to itself, so that the
    commands it starts (``ip``, ``tc``) may build links there (the shaped link's hub).

    Raises :class:`Refused` (with the kernel's reason) where the kernel refuses both ways, and
    ``OSError`` if the namespaces were made but could not be set up (then do not go on).
    """
    libc = _libc()
    if os.geteuid() == 0 and libc.unshare(CLONE_NEWNET | CLONE_NEWNS) == 0:
        mode = "root"
    else:
        uid, gid = os.geteuid(), os.getegid()
        _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS),
               "unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS)", Refused)
        Path("/proc/self/setgroups").write_text("deny")  # required before an unprivileged gid_map
        inside = (0, 0) if as_root else (uid, gid)
        Path("/proc/self/uid_map").write_text(f"{inside[0]} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{inside[1]} {gid} 1")
        mode = "user namespace"
    _loopback_up()
    with contextlib.suppress(OSError):  # only cosmetic: c10d then warns once per process
        _private_hosts(libc)
    return mode


def join(pid: int) -> None:
    """Enter the namespaces :func:`enter` made for process ``pid`` (network, mount, user)."""
    libc, cwd = _libc(), os.getcwd()
    kinds = [("user", CLONE_NEWUSER), ("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS)]
    fds = {name: os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY) for name, _ in kinds
           if os.readlink(f"/proc/self/ns/{name}") != os.readlink(f"/proc/{pid}/ns/{name}")}
    try:
        for name, flag in kinds:
            if name in fds:
                _check(libc.setns(fds[name], flag), f"setns into the {name} namespace of {pid}")
    finally:
        for fd in fds.values():
            os.close(fd)
    os.chdir(cwd)  # entering a mount namespace moves the working directory to its root
