"""``RankError`` (a rank of :func:`course_lib.run` failed) and how it shows: one line first.

The message is the one-line summary when :mod:`course_lib.launcher._diagnose` recognised the failure, the rank's
exception and traceback, then the raw dump a dying process wrote (gloo's ``EnforceNotMet``,
"Fatal Python error", thread dumps), which the launcher held back instead of streaming it.
:meth:`RankError.view` is the same as a display object: plain text in a terminal, and in a
notebook the raw dump folded behind a ``<details>`` toggle. In an IPython kernel, ``run``
shows a ``RankError`` it raises through that view (unless another custom handler is set).
"""
from __future__ import annotations

import signal
import sys

from course_lib.display import Folded

__all__ = ["RankError", "Folded", "failure_of", "show_in_notebook"]


class RankError(RuntimeError):
    """A rank failed. ``rank``, ``exc_type`` and ``remote_traceback`` tell which and why;
    ``summary`` is one line naming a recognised cause, ``raw`` what the process wrote as it died."""

    def __init__(self, rank: int, nprocs: int, exc_type: str, message: str, remote_traceback: str,
                 summary: str | None = None, raw: str = ""):
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback
        self.summary, self.raw = summary, raw.rstrip()
        lines = len(self.raw.splitlines())
        self._label = f"raw output of rank {rank} as it died ({lines} lines)"
        self._text = (("" if summary is None else f"{summary}\n") +
                      f"rank {rank} of {nprocs} failed with {exc_type}: {message}\n"
                      f"\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}")
        super().__init__(repr(self.view()) + "\n--- the other ranks were stopped ---")

    def view(self) -> Folded:
        """The error as a display object: the raw dump below the summary, or folded in HTML."""
        return Folded(self._text, self.raw, self._label)


def failure_of(state, nprocs: int) -> RankError:
    """The :class:`RankError` for a failed rank (``state``: its ``_rank_pipes.Rank``)."""
    from course_lib.launcher import _diagnose
    stderr = "\n".join(state.err_tail)
    raw = "\n".join(state.dump)
    state.dump_shown = True
    if state.outcome and state.outcome[0] == "error":
        _, exc_type, message, tb = state.outcome
        return RankError(state.rank, nprocs, exc_type, message, tb,
                         _diagnose.summary(state.rank, message, stderr), raw)
    code = state.exitcode
    if code is not None and code < 0:
        how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
    else:
        how = f"exited with code {code}"
    said = _diagnose.summary(state.rank, "", stderr)
    return RankError(state.rank, nprocs, "ProcessDied", f"the process {how} before returning",
                     "(no Python traceback: the process ended abruptly)",
                     said, raw or (stderr if said else ""))


def _handler(shell, etype, value, tb, tb_offset=None) -> list[str]:
    from IPython.display import display
    display(value.view())
    first = value.summary or str(value).splitlines()[0]
    return [f"\x1b[0;31m{etype.__name__}\x1b[0m: {first}"]


def show_in_notebook() -> None:
    """In an IPython kernel: show an uncaught ``RankError`` through its view (once per kernel)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is None or getattr(shell, "kernel", None) is None:
        return
    if not shell.custom_exceptions or shell.custom_exceptions == (RankError,):
        shell.set_custom_exc((RankError,), _handler)
