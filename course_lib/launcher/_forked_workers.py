"""torchrun's workers forked from its agent with torch preloaded: the default in a learner's pod.

torchrun starts each worker as ``python -u SCRIPT`` (its ``SubprocessHandler``): a fresh
interpreter that imports torch and, once a script builds DDP or steps an optimizer,
``torch._dynamo`` again (~0.24 GiB of private pages each; issue 50). In ``fork`` mode
:mod:`course_lib.launcher._loopback_torchrun` imports those once in the agent (``install``), and
the agent's ``Popen`` of a worker forks it instead: same session, log files, environment,
``sys.argv``, ``__main__`` (kept to the end), exit status and signals; the workers share the
agent's pages copy-on-write. ``auto`` (default) forks in a small pod (as ``server_paused``
pauses) and keeps torchrun's fresh interpreters elsewhere; the benchmark measures both.
"""
from __future__ import annotations

import os
import subprocess

from course_lib.launcher._server_cache import pauses_for_torchrun
from course_lib.launcher._warm import _PRELOAD

MODES = ("auto", "fresh", "fork")


def worker_mode() -> str:
    """How torchrun's agent starts its workers, from ``COURSE_TORCHRUN_WORKERS``: ``fresh``
    (torchrun's own ``python -u SCRIPT``), ``fork`` (forked from the agent), or ``auto``
    (default): ``fork`` where :func:`pauses_for_torchrun` (a pod of 4 GiB or less), else
    ``fresh``. The launcher passes the answer to the agent in the same variable."""
    mode = os.environ.get("COURSE_TORCHRUN_WORKERS", "auto")
    if mode not in MODES:
        raise ValueError(f"COURSE_TORCHRUN_WORKERS must be auto, fresh or fork, got {mode!r}")
    if mode == "auto":
        return "fork" if pauses_for_torchrun() else "fresh"
    return mode


class ForkedPopen(subprocess.Popen):
    """A ``Popen`` whose child is a fork of this process running ``python -u [-m] TARGET``."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, *rest):
        target = list(args)[2:] if list(args)[1:2] == ["-u"] else []
        if not target or shell or cwd or preexec_fn or target[0].startswith("-") and \
                target[:1] != ["-m"]:  # not a plain worker command line: exec it as torchrun does
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds,
                                          cwd, env, startupinfo, creationflags, shell, p2cread,
                                          p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest)
        pid = os.fork()
        if pid == 0:
            _worker(target, env, c2pwrite, errwrite, start_new_session=rest[-2])
        self.pid, self._child_created = pid, True


def _worker(target: list[str], env: dict, out: int, err: int, start_new_session: bool) -> None:
    """The forked worker: set up what ``python -u`` would, run ``target``, exit with its code."""
    import atexit
    import builtins
    import gc
    import io
    import runpy
    import signal
    import sys
    import types
    code = 1
    try:
        gc.freeze()  # the agent's objects (its garbage included) stay untouched, never finalised
        if start_new_session:
            os.setsid()
        for fd, std in ((out, 1), (err, 2)):
            if fd != -1:
                os.dup2(fd, std)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)  # the agent's handlers raise in the agent
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        atexit._clear()  # the agent's exit functions are not the worker's
        os.environ.clear()
        os.environ.update(env)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
        try:
            # in a real __main__ kept to the end, as ``python`` runs it: freeing the script's
            # globals while it runs (runpy's temporary module) ends DDP's Reducer, and with it
            # the gloo group, under the GIL that its threads wait for (a hang, seen)
            sys.modules["__main__"] = types.ModuleType("__main__")
            if target[0] == "-m":
                sys.argv, sys.path[0] = target[1:], os.getcwd()
                runpy._run_module_as_main(target[1])
            else:
                sys.argv, sys.path[0] = target, os.path.dirname(os.path.realpath(target[0]))
                main = sys.modules["__main__"].__dict__
                main.update(__file__=target[0], __builtins__=builtins, __cached__=None)
                with open(target[0], "rb") as f:
                    exec(compile(f.read(), target[0], "exec"), main)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else exc.code is not None
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - reported as an uncaught exception would be
            sys.excepthook(*sys.exc_info())
            code = 1
        atexit._run_exitfuncs()  # the script's (init_distributed's own ends the process)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(int(code))


def install() -> None:
    """In torchrun's agent, before it starts: import what the workers would (torch._dynamo
    and the parallel modules the warm server preloads too), freeze it, fork workers."""
    import gc

    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    for name in _PRELOAD:
        if name.startswith("torch"):
            __import__(name)
    subprocess_handler.Popen = ForkedPopen
    gc.collect()
    gc.freeze()
