"""Run a command and make sure nothing it started outlives it (or us).

``python -m course_lib.launcher._reaper CMD...`` runs CMD (e.g. ``torchrun ...``) as a child:
torchrun's workers live in their own sessions, so a killed Jupyter kernel would leave them
running. It becomes a Linux *child subreaper* (orphaned workers are re-parented here), kills the
whole tree when its stdin closes (the kernel died or gave up), on SIGTERM and after CMD exits,
and exits with CMD's exit code. ``--net=private`` starts CMD in a private network namespace
(:mod:`course_lib.launcher._private_net`) or, where the kernel refuses, where we are;
``--net=private-only`` there or nowhere (the refusal is reported, CMD never starts, exit code
3); ``--net=join:PID`` in PID's. ``--ready-fd=N`` then says which on fd N (``private PID`` with
CMD's pid, ``shared <reason>`` or ``refused <reason>``). :func:`start` is the parent's side.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
from typing import Sequence

import psutil

from course_lib.launcher import _private_net

_PR_SET_CHILD_SUBREAPER = 36


def start(cmd: list[str], net: str | None = None, prefix: Sequence[str] = (),
          **popen) -> tuple[subprocess.Popen, str | None, int | None]:
    """Start the reaper on ``cmd``: ``(reaper, why its network is shared or None, pid inside)``.

    ``net``: ``"private"``, ``"private-only"``, ``"join:PID"`` or None (the caller's network,
    not asked for); ``prefix`` goes before the reaper (``ip netns exec NS``). Returns once CMD
    has started (or, with ``"private-only"``, was refused: then the reaper has ended and the
    reason is the second item); the pid is CMD's (the one to join), None when shared.
    """
    reaper = [*prefix, sys.executable, "-m", "course_lib.launcher._reaper"]
    if net is None:
        return subprocess.Popen([*reaper, *cmd], **popen), "not asked for", None
    read, write = os.pipe()
    try:
        proc = subprocess.Popen([*reaper, f"--net={net}", f"--ready-fd={write}", *cmd],
                                pass_fds=(write,), **popen)
    finally:
        os.close(write)
    try:  # a python start-up: well under a second when idle; the status is one short write
        status = os.read(read, 4096) if select.select([read], [], [], 60)[0] else b""
    finally:
        os.close(read)
    if not status:  # it died or hung before it could start CMD: stop it, say why
        proc.kill()
        out = proc.communicate(timeout=10)[0] or b""
        raise RuntimeError("the process supervisor failed before starting the job:\n"
                           + out.decode("utf-8", "replace")[-2000:])
    kind, _, rest = status.decode("utf-8", "replace").partition(" ")
    return (proc, None, int(rest)) if kind == "private" else (proc, rest, None)


def _kill_tree() -> None:
    me = psutil.Process()
    for _ in range(3):  # re-scan: a dying parent may re-parent children to us meanwhile
        if not (children := me.children(recursive=True)):
            return
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(children, timeout=5)


def _popen(cmd: list[str], net: str | None) -> tuple[subprocess.Popen | None, str]:
    """Start CMD in the network asked for; return it and the status line for ``--ready-fd``."""
    if not net:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL), "shared not asked for"
    read, write = os.pipe()

    def move() -> None:  # in the child, between fork and exec (single-threaded)
        try:
            if net in ("private", "private-only"):
                _private_net.enter()
            elif net.startswith("join:"):
                _private_net.join(int(net[5:]))
            else:
                raise OSError(f"unknown --net={net}")
        except BaseException as exc:
            os.write(write, f"{exc}".encode()[:2000])  # the parent learns why
            raise

    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=move)
        return proc, f"private {proc.pid}"
    except subprocess.SubprocessError:  # the child could not move: it is gone, we are unchanged
        os.close(write)
        write = None
        reason = os.read(read, 4096).decode("utf-8", "replace") or "unknown"
        if net == "private-only":
            return None, f"refused {reason}"
        if net != "private":
            raise SystemExit(f"course_lib: could not join the job's private network: {reason}")
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL), f"shared {reason}"
    finally:
        os.close(read)
        if write is not None:
            os.close(write)


def main(argv: list[str]) -> int:
    opts = {}
    while argv and argv[0].startswith(("--net=", "--ready-fd=")):
        key, _, value = argv.pop(0)[2:].partition("=")
        opts[key] = value
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    proc, status = _popen(argv, opts.get("net"))  # no thread exists yet: preexec_fn is safe
    if "ready-fd" in opts:
        os.write(int(opts["ready-fd"]), status.encode())
        os.close(int(opts["ready-fd"]))
    if proc is None:  # --net=private-only, refused: nothing was started
        print(f"course_lib: no private network namespace: {status[8:]}", file=sys.stderr)
        return 3

    def on_lifeline() -> None:
        while sys.stdin.buffer.read(1):
            pass
        _kill_tree()
        os._exit(137)

    threading.Thread(target=on_lifeline, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: (_kill_tree(), os._exit(143)))
    code = proc.wait()
    _kill_tree()
    return code


if __name__ == "__main__":
    code = main(list(sys.argv[1:]))
    sys.stdout.flush()
    os._exit(code if code >= 0 else 128 - code)  # no interpreter shutdown with the stdin thread