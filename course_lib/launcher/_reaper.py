"""Run a command and make sure nothing it started outlives it (or us).

``python -m course_lib.launcher._reaper CMD...`` runs CMD (e.g. ``torchrun ...``) as a child. torchrun's
workers live in their own sessions, so a killed Jupyter kernel would leave them running. This
small supervisor sits between the kernel and torchrun and

* becomes a *child subreaper* (Linux), so workers orphaned by a dying torchrun are re-parented
  here and can still be found;
* kills the whole tree when its stdin closes (the kernel died or gave up), on SIGTERM, and after
  CMD exits (any leftovers);
* exits with CMD's exit code.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading

import psutil

_PR_SET_CHILD_SUBREAPER = 36


def _kill_tree() -> None:
    me = psutil.Process()
    for _ in range(3):  # re-scan: a dying parent may re-parent children to us meanwhile
        children = me.children(recursive=True)
        if not children:
            return
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=5)


def main(cmd: list[str]) -> int:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

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
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code if code >= 0 else 128 - code)  # no interpreter shutdown with the stdin thread
