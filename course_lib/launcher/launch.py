"""``run``: a function typed in a notebook cell, executed on N real processes.

Why not ``torch.multiprocessing.spawn``? It cannot start a function defined in a notebook cell
(the child looks it up in ``__main__``), and ``torchrun`` costs seconds per launch because every
rank imports torch again. Here ranks are forked from a warm fork server with torch preloaded
(:mod:`course_lib.launcher._warm`), the function travels by value (cloudpickle), rendezvous uses
a file store in a private directory, each rank's output streams live into the cell as
``[rank r]``, and a failing rank, a timeout or an interrupt ends every rank (a dying parent takes
its ranks with it through a lifeline pipe, :mod:`course_lib.launcher._worker`). Chapter 00
introduces it; for scripts and multi-node command lines see :func:`course_lib.torchrun`.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import linecache
import os
import selectors
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import cloudpickle

from course_lib.launcher import _diagnose, _results, devices, progress
from course_lib.launcher._rank_error import RankError, failure_of, show_in_notebook
from course_lib.launcher._rank_pipes import PIPES, Rank, drain, pump, settle, wait_exit
from course_lib.launcher._run_guard import holding_interrupts, make_run_dir
from course_lib.launcher._server_cache import ServerCache as _ServerCache, pauses_for_torchrun
from course_lib.launcher._server_cache import idle_seconds, memory_limit  # noqa: F401 (their home)
from course_lib.launcher._warm import WarmServer, preimports_of

__all__ = ["run", "RankError", "RunReport", "warm_up", "server_paused"]


_SERVERS = _ServerCache()  # per-process cache of a process handle, not course state


def serve_from_here() -> None:
    """From now on fork this process's ranks from a copy of it (``_fork_here``), not from a
    fresh interpreter: for a child that imported torch itself. Call it while no thread runs."""
    from course_lib.launcher._fork_here import fork_server
    _SERVERS.mark_forked(fork_server())


@contextmanager
def server_paused():
    """End this process's warm server for the block (where :func:`pauses_for_torchrun`) and, if
    one was running, start it again in the background once the notebook cell has finished (at
    once outside IPython). :func:`course_lib.torchrun` runs inside it: its agent and workers
    import torch themselves, and an idle server beside them (torch loaded, about a quarter GiB)
    only adds to the chapter's peak, as would one restarting beside the rest of the cell
    (``%%torchrun``'s one-process reference; issue 50). A ``run`` before then starts it itself."""
    ended = pauses_for_torchrun() and _SERVERS.end()
    give_back_heap()
    try:
        yield
    finally:
        if ended:
            _after_cell(_restart_server)


def _restart_server(*_) -> None:  # noqa: D103
    with contextlib.suppress(OSError):  # none could start now: the next run tries again
        _SERVERS.get(wait=False)


def _after_cell(callback: Callable) -> None:
    """Call ``callback`` once the running IPython cell has finished, or now outside IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        callback()
        return

    def once(*args) -> None:
        shell.events.unregister("post_run_cell", once)
        callback(*args)
    shell.events.register("post_run_cell", once)


def give_back_heap(collect: bool = False) -> None:
    """In a learner's pod (:func:`pauses_for_torchrun`), the kernel before ranks or torchrun
    start: hand glibc's freed heap back (``malloc_trim(0)``, after ``gc.collect()`` if
    ``collect``; ~20 ms). Elsewhere nothing: no nbval run pays for it (issue 50)."""
    if pauses_for_torchrun():
        if collect:
            gc.collect()
        with contextlib.suppress(AttributeError, OSError):  # not glibc (macOS)
            ctypes.CDLL(None).malloc_trim(0)


def warm_up(wait: bool = True) -> None:
    """Start the warm server now (it imports torch once, a few seconds), so the first run is fast.

    ``wait=False`` returns at once and lets the server import torch in the background while
    the notebook goes on (its own ``import torch`` on the other core): call it first thing in
    the first cell. The first ``run`` then waits only for what is left of the server's start.
    """
    _SERVERS.get(wait=wait)


def _sources(fn: Callable[..., Any]) -> dict[str, list[str]]:
    """Source lines of ``fn``'s file when only this process knows them (a notebook cell)."""
    code = getattr(fn, "__code__", None)
    if code is None or os.path.exists(code.co_filename):
        return {}
    lines = linecache.getlines(code.co_filename)
    return {code.co_filename: lines} if lines else {}


@dataclass
class RunReport:
    """What one ``run`` observed about its own ranks; pass ``run(..., report=RunReport())``.

    ``exit_statuses``: each rank's exit status in rank order (0 = clean exit, negative = killed
    by that signal, e.g. -6 SIGABRT; ``None`` = had not ended within the 5-second drain).
    ``phases``: ``(phase, seconds since run was called)`` for the launching process, and
    ``rank_phases[r]`` the same for rank ``r`` — the launch-overhead breakdown printed by
    ``benchmarks/bench_launch.py``.
    """

    exit_statuses: list = field(default_factory=list)
    phases: list = field(default_factory=list)
    rank_phases: list = field(default_factory=list)


def run(fn: Callable[..., Any], nprocs: int = 2, *args: Any, backend: str | None = None,
        device: str | None = None, timeout: float = 120.0, threads: int | None = None,
        report: RunReport | None = None, debug: str | None = None, **kwargs: Any) -> list:
    """Run ``fn(*args, **kwargs)`` on ``nprocs`` processes with torch.distributed initialised.

    Returns the per-rank return values in rank order. Inside ``fn``, ``dist.get_rank()`` and
    ``dist.get_world_size()`` work as usual (and ``RANK``/``WORLD_SIZE`` are set as torchrun
    sets them). ``backend``/``device`` override the automatic choice (gloo on CPU; NCCL with one
    GPU per rank when there are enough GPUs — see :func:`course_lib.launcher.devices.plan`).
    ``timeout`` (seconds) bounds the whole run; ``threads`` sets torch threads per rank.
    ``report``, a :class:`RunReport`, is filled in with the ranks' exit statuses and a timing
    breakdown (for tests and benchmarks). ``debug`` (``"off"``, ``"info"``, ``"detail"``) sets
    torch.distributed's debug level in the ranks (``"detail"`` checks every collective's
    consistency across ranks: a mismatch raises instead of hanging or aborting).
    The names ``backend``, ``device``, ``timeout``, ``threads``, ``report`` and ``debug`` belong
    to ``run``: to give ``fn`` arguments with those names, wrap it with ``functools.partial``.

    Raises :class:`RankError` naming the first rank that failed (with its traceback),
    ``TimeoutError`` when ranks do not finish in time (with each unfinished rank's Python stack,
    taken before it is killed); a recognised collective mismatch is named in the error's first
    line. On any error or interrupt all ranks are
    killed before ``run`` returns. An interrupt (Stop) raises a one-line ``KeyboardInterrupt``;
    where it arrived inside ``run`` is kept in its ``__context__``.
    """
    start = time.monotonic()
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    devices.validate_timeout(timeout)
    level = _diagnose.validate_debug(debug)
    placement = devices.place(nprocs, backend, device, threads)
    try:
        payload = cloudpickle.dumps((fn, args, kwargs, _sources(fn)))
    except Exception as exc:
        raise TypeError(f"cannot ship {getattr(fn, '__name__', fn)!r} and its arguments to the "
                        f"ranks: {exc}") from exc
    phases = [("called", start), ("checked and pickled", time.monotonic())]
    context = {"sys_path": list(sys.path), "cwd": os.getcwd(), "environ": dict(os.environ),
               "debug": level}
    try:
        give_back_heap()
        with _SERVERS.using() as server:
            phases.append(("server ready", time.monotonic()))
            return _launch(server, fn, placement, payload, timeout, report, start, phases,
                           context)
    except RankError:
        show_in_notebook()  # in a kernel: the raw dump of a dying rank folded under one line
        raise
    except KeyboardInterrupt:
        # the ranks are gone already; the frames inside the launcher would only hide that
        raise KeyboardInterrupt(f"run on {nprocs} rank(s) stopped; every rank was ended") \
            from None


def _launch(server: WarmServer, fn: Callable[..., Any], placement: devices.Placement,
            payload: bytes, timeout: float, report: RunReport | None, start: float, phases: list,
            context: dict) -> list:
    """Start the ranks on the ready server, supervise them, end every one on the way out."""
    nprocs = placement.nprocs
    workdir = make_run_dir()
    lifeline_r, lifeline_w = os.pipe()
    ranks: list[Rank] = []
    sel = selectors.DefaultSelector()
    succeeded, pipes = False, []
    try:
        jobs = [(rank, placement, os.path.join(workdir, "store"), timeout, payload, context)
                for rank in range(nprocs)]
        with holding_interrupts():  # Stop waits until every started rank is in `ranks`
            pipes = [{name: os.pipe() for name in PIPES} for _ in range(nprocs)]
            try:
                pids = server.fork(jobs, [[p["out"][1], p["err"][1], p["result"][1], lifeline_r,
                                           p["exit"][1]] for p in pipes], preimports_of(fn))
            finally:
                for p in pipes:
                    for _, w in p.values():  # the server and the child hold their own copies
                        os.close(w)
            for rank, (pid, p) in enumerate(zip(pids, pipes)):
                state = Rank(rank, pid, {name: r for name, (r, _) in p.items()})
                ranks.append(state)
                for name, fd in state.fds.items():
                    sel.register(fd, selectors.EVENT_READ, (state, name))
            pipes = []
        phases.append(("ranks forked", time.monotonic()))
        os.close(lifeline_r)
        lifeline_r = -1
        results = _supervise(ranks, sel, nprocs, time.monotonic() + timeout, timeout, workdir)
        phases.append(("results in", time.monotonic()))
        succeeded = True
        return results
    finally:
        # After a success, every rank has closed its output and waits for a byte on the lifeline
        # to end (status 0). Unless exit statuses are asked for, release them only on the way
        # out: their exits (~10 ms of CPU each, the server reaps them) then overlap with
        # whatever the caller does next instead of delaying this return.
        release_late = succeeded and report is None  # a report waits for the exit statuses
        if not release_late:
            _release(lifeline_w, nprocs if succeeded else 0)
            lifeline_w = -1
        try:
            for state in ranks:
                if state.outcome is None:
                    state.kill()
            drain(sel, deadline=time.monotonic() + 5, wait_exit=not release_late)
            for state in ranks:  # a dump held back for an error that reported another rank
                for line in [] if state.dump_shown else state.dump:
                    progress.emit(line, state.rank, sys.stderr)
        finally:  # even when a second Stop arrives while draining
            try:
                if not succeeded:
                    for state in ranks:
                        state.kill()  # one that answered and still did not end
                phases.append(("output closed" if release_late else "ranks ended",
                               time.monotonic()))
                sel.close()
                for fd in [fd for state in ranks for fd in state.fds.values()] + \
                        [r for p in pipes for r, _ in p.values()] + [lifeline_r]:
                    if fd >= 0:  # pipes of ranks that never started too (the server failed)
                        os.close(fd)
                shutil.rmtree(workdir, ignore_errors=True)
            finally:
                if lifeline_w >= 0:
                    _release(lifeline_w, nprocs)
        if report is not None:
            report.exit_statuses = [state.exitcode for state in ranks]
            report.phases = [(name, t - start) for name, t in phases]
            report.rank_phases = [[(name, t - start) for name, t in state.stamps]
                                  for state in ranks]


def _release(lifeline_w: int, nprocs: int) -> None:
    """Write one byte per rank on the lifeline (each ends cleanly), then close it (any rank still
    working kills itself — the same as when the parent dies)."""
    try:
        with contextlib.suppress(OSError):  # BrokenPipeError: every rank has gone already
            os.write(lifeline_w, b"x" * nprocs)
    finally:
        os.close(lifeline_w)


def _supervise(ranks: list[Rank], sel: selectors.BaseSelector, nprocs: int, deadline: float,
               timeout: float, workdir: str) -> list:
    """Forward output and collect results until every rank answered, one failed, or time is up."""
    waiting = set(range(nprocs))
    with progress.watch(f"run on {nprocs} ranks", nprocs) as view:  # silent outside a notebook
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stacks = _diagnose.collect_stacks({r: ranks[r].pid for r in waiting}, workdir)
                raise TimeoutError(_diagnose.timeout_message(sorted(waiting), nprocs, timeout,
                                                             stacks))
            for key, _ in sel.select(timeout=min(remaining, view.wait)):
                state, name = key.data
                if pump(state, name, key.fd, sel):
                    continue
                if name != "result" and (name != "exit" or state.rank not in waiting):
                    continue
                settle(state, sel)  # gone (an exit): its result is what its pipe holds, if open
                if state.outcome is None or state.outcome[0] == "error":
                    wait_exit(state, sel)
                    culprit = _diagnose.culprit(state, ranks, sel)
                    if culprit is not state:  # a victim of a peer that died: name the peer
                        wait_exit(culprit, sel)
                    raise failure_of(culprit, nprocs, ranks)
                waiting.discard(state.rank)
                view.update(done=nprocs - len(waiting))
            view.tick()
        for key, _ in sel.select(timeout=0):  # lines written before the last result, if unread
            if key.data[1] in ("out", "err"):
                pump(key.data[0], key.data[1], key.fd, sel)
    return [_results.loads(state.outcome[1]) for state in ranks]
