"""torchrun's workers forked from its agent with torch preloaded: the default in a learner's pod.

torchrun starts each worker as ``python -u SCRIPT`` (its ``SubprocessHandler``): a fresh
interpreter that imports torch and, once a script builds DDP or steps an optimizer,
``torch._dynamo`` again (~0.24 GiB of private pages each; issue 50). In ``fork`` mode
:mod:`course_lib.launcher._loopback_torchrun` imports those once in the agent (``install``), and
the agent's ``Popen`` of a worker forks it instead: same session, log files, environment,
``sys.argv``, ``__main__`` (kept to the end), exit status and signals; the workers share the
agent's pages copy-on-write. ``auto`` (default) forks in a small pod (as ``server_paused``
pauses) and keeps torchrun's fresh interpreters elsewhere; the benchmark measures both.
:class:`ForkedCall` is the same child for a function (the shaped link's nodes, forked from
their hub everywhere).
"""
from __future__ import annotations

import os
import subprocess

from course_lib.launcher._server_cache import pauses_for_torchrun
from course_lib.launcher._warm import _PRELOAD, preload

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


class ForkPopen(subprocess.Popen):
    """A ``Popen`` whose child is a fork of this process running :meth:`child_main` (its exit
    status); stdin, stdout, stderr, ``env`` and ``start_new_session`` as ``Popen`` gives them.
    Fork only where no other thread holds a lock the child needs (torch's own threads start
    later; Python's locks are reset at fork)."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, *rest):
        pid = os.fork()
        if pid == 0:
            _child(self, (p2cread, c2pwrite, errwrite), env, start_new_session=rest[-2])
        self.pid, self._child_created = pid, True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def child_main(self) -> int:
        raise NotImplementedError


class ForkedCall(ForkPopen):
    """``ForkedCall(fn, **popen)``: the child calls ``fn()``; exit status 0, or 1 after its
    traceback (chapter 05's link nodes, forked from a hub that imported torch once)."""

    def __init__(self, fn, **popen):
        self._fn = fn
        super().__init__(["<fork>"], **popen)

    def child_main(self) -> int:
        self._fn()
        return 0


class ForkedPopen(ForkPopen):
    """A ``Popen`` whose child is a fork of this process running ``python -u [-m] TARGET``."""

    def _execute_child(self, args, *more):
        target = list(args)[2:] if list(args)[1:2] == ["-u"] else []
        preexec_fn, cwd, shell = more[1], more[4], more[8]
        if not target or shell or cwd or preexec_fn or target[0].startswith("-") and \
                target[:1] != ["-m"]:  # not a plain worker command line: exec it as torchrun does
            return subprocess.Popen._execute_child(self, args, *more)
        self._target = target
        return super()._execute_child(args, *more)

    def child_main(self) -> int:
        """Run the target in a real ``__main__`` kept to the end, as ``python`` runs it:
        freeing the script's globals while it runs (runpy's temporary module) ends DDP's
        Reducer, and with it the gloo group, under the GIL that its threads wait for (a hang,
        seen)."""
        import builtins
        import runpy
        import sys
        import types
        target = self._target
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
        return 0


def _child(popen: ForkPopen, fds: tuple, env: dict | None, start_new_session: bool) -> None:
    """The forked child: set up what a fresh process would have, run, exit with its code."""
    import atexit
    import gc
    import io
    import signal
    import sys
    code = 1
    try:
        gc.freeze()  # the parent's objects (its garbage included) stay untouched, never finalised
        if start_new_session:
            os.setsid()
        for fd, std in zip(fds, (0, 1, 2)):
            if fd != -1:
                os.dup2(fd, std)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)  # the parent's handlers raise in the parent
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        atexit._clear()  # the parent's exit functions are not the child's
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if fds[0] != -1:
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
        try:
            code = popen.child_main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else exc.code is not None
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - reported as an uncaught exception would be
            sys.excepthook(*sys.exc_info())
            code = 1
        atexit._run_exitfuncs()  # the child's own (init_distributed's ends the process)
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
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    subprocess_handler.Popen = ForkedPopen
    preload(name for name in _PRELOAD if name.startswith("torch"))
