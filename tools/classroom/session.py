"""A kernel that runs untrusted exercise code under limits: time, output, its own folder.

The kernel starts with a fresh temporary directory as its working directory and ``HOME`` (and
another as ``TMPDIR``, where the ranks' stores go), so a submission that deletes or writes files
finds only these folders (removed afterwards; this is
containment of mistakes, not a sandbox against a hostile user: run the grader as a user that can
write nothing else, or in a container). Each execution has a time limit (interrupt, then kill) and
an output cap (interrupt when exceeded); a kernel that dies (``os._exit``, a segfault) is
reported, and :meth:`Session.restart` gives a fresh one. Killing the kernel kills its process
group; the ranks ``course_lib.run`` started end with it (their lifeline closes).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from queue import Empty

from jupyter_client import KernelManager


@dataclass
class Outcome:
    """What one execution did: its error (None: ran to the end), output, and the limit it hit."""

    error: str | None = None
    output: str = ""
    limit: str | None = None            # "time", "output" or "died"
    expressions: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.limit is None


class Session:
    """One kernel in its own temporary folder; ``run`` executes a cell's code under limits."""

    def __init__(self, *, output_cap: int = 100_000, grace: float = 10.0) -> None:
        self.output_cap, self.grace = output_cap, grace
        self.folder = tempfile.mkdtemp(prefix="course-grade-")
        self.private = tempfile.mkdtemp(prefix="course-kernel-")  # sockets, outside the cwd
        self.tmp = os.path.join(self.private, "tmp")  # TMPDIR (the ranks' stores), also outside
        self.km = self.kc = None
        self._start()

    def _start(self) -> None:
        os.makedirs(self.tmp, exist_ok=True)
        env = dict(os.environ, HOME=self.folder, TMPDIR=self.tmp, PYDEVD_DISABLE_FILE_VALIDATION="1")
        # IPC sockets in a folder only this user can enter: no TCP port for others to find
        self.km = KernelManager(kernel_name="python3", transport="ipc",
                                ip=os.path.join(self.private, "kernel"),
                                connection_file=os.path.join(self.private, "kernel.json"))
        self.km.start_kernel(cwd=self.folder, env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def restart(self) -> None:
        """A fresh kernel (same folder, emptied): after a death or a kill."""
        self._stop()
        shutil.rmtree(self.folder, ignore_errors=True)
        os.makedirs(self.folder, exist_ok=True)
        self._start()

    def _stop(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None and self.km.has_kernel:
            self.km.shutdown_kernel(now=True)
        self.km = self.kc = None

    def reset_folder(self) -> None:
        """Make the folders exist again, the kernel's cwd the first (a submission may delete them)."""
        self.run(f"import os as _o\n_o.makedirs({self.folder!r}, exist_ok=True)\n"
                 f"_o.makedirs({self.tmp!r}, exist_ok=True)\n"
                 f"_o.chdir({self.folder!r})\ndel _o", time_limit=30)

    @property
    def alive(self) -> bool:
        return self.km is not None and self.km.has_kernel and self.km.is_alive()

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, code: str, *, time_limit: float, expressions: dict | None = None) -> Outcome:
        """Execute ``code``; past ``time_limit`` s or the output cap, interrupt (then kill)."""
        msg_id = self.kc.execute(code, silent=False, store_history=False, allow_stdin=False,
                                 user_expressions=expressions or {})
        outcome, size, idle, reply = Outcome(), 0, False, None
        deadline, stop_at = time.monotonic() + time_limit, None
        while not (idle and reply is not None):
            now = time.monotonic()
            if stop_at is not None and now > stop_at:           # the interrupt did not stop it
                self.km.shutdown_kernel(now=True)
                outcome.error = outcome.error or "killed: it did not stop when interrupted"
                return outcome
            if stop_at is None and now > deadline:
                outcome.limit = "time"
                self._interrupt()
                stop_at = now + self.grace
            if not self.km.is_alive():
                outcome.limit = outcome.limit or "died"
                return outcome
            if reply is None:
                reply = self._reply(msg_id)
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                idle = True
            elif kind == "error" and outcome.error is None:
                outcome.error = f"{content['ename']}: {content['evalue']}"
            elif kind in ("stream", "display_data", "execute_result"):
                text = content.get("text") or content.get("data", {}).get("text/plain", "")
                size += len(text)
                if size <= self.output_cap:
                    outcome.output += text
                elif stop_at is None:
                    outcome.limit = "output"
                    self._interrupt()
                    stop_at = time.monotonic() + self.grace
        if reply["content"].get("status") == "error" and outcome.error is None:
            outcome.error = f"{reply['content']['ename']}: {reply['content']['evalue']}"
        outcome.expressions = reply["content"].get("user_expressions", {})
        return outcome

    def _reply(self, msg_id: str):
        try:
            msg = self.kc.get_shell_msg(timeout=0)
        except Empty:
            return None
        return msg if msg["parent_header"].get("msg_id") == msg_id else None

    def _interrupt(self) -> None:
        try:
            self.km.interrupt_kernel()
        except Exception:  # noqa: BLE001 - a dead kernel is handled by the caller's loop
            pass
