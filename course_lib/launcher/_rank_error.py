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

__all__ = ["RankError", "Folded", "failure_of", "ending", "show_in_notebook"]


class RankError(RuntimeError):
    """A rank failed. ``rank``, ``exc_type`` and ``remote_traceback`` tell which and why;
    ``summary`` is one line naming a recognised cause, ``raw`` what the process wrote as it died,
    ``ended`` how it ended (exit code or signal), ``last_lines`` its last lines (no traceback)."""

    def __init__(self, rank: int, nprocs: int, exc_type: str, message: str, remote_traceback: str,
                 summary: str | None = None, raw: str = "", *, ended: str | None = None,
                 last_lines: str | None = None, others: str = "the other ranks were stopped"):
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback
        self.summary, self.raw, self.ended = summary, raw.rstrip(), ended
        self.last_lines = last_lines  # what a rank without a traceback wrote last, or None
        lines = len(self.raw.splitlines())
        self._label = f"raw output of rank {rank} as it died ({lines} lines)"
        # an exception may carry no message (EOFError() from a closed pipe): say so, never ""
        said = f": {message}" if message.strip() else " (it carries no message; the traceback " \
            "below shows where it was raised)"
        head = f"rank {rank} of {nprocs} failed with {exc_type}{said}"
        if ended:
            head += f"; the process {ended}"
        self._text = (("" if summary is None else f"{summary}\n") + head +
                      f"\n\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}")
        if last_lines is not None:
            self._text += (f"\n--- the last lines rank {rank} wrote (stdout and stderr) ---\n"
                           f"{last_lines.rstrip() or '(it wrote nothing)'}")
        super().__init__(repr(self.view()) + f"\n--- {others} ---")

    def view(self) -> Folded:
        """The error as a display object: the raw dump below the summary, or folded in HTML."""
        return Folded(self._text, self.raw, self._label)


def ending(exitcode: int | None) -> str | None:
    """How a process ended, from its exit status (negative: the signal), or ``None``."""
    if exitcode is None:
        return None
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by signal {-exitcode} ({name})"
    return f"exited with code {exitcode}"


def _others(state, ranks: list) -> str:
    """What became of the ranks other than ``state``: those that had ended on their own, named."""
    gone = [f"rank {r.rank} {ending(r.exitcode)}" for r in ranks
            if r is not state and r.exitcode is not None]
    if not gone:
        return "the other ranks were stopped"
    rest = len(ranks) - 1 - len(gone)
    return "; ".join(gone) + (f"; the other {rest} were stopped" if rest else "")


def failure_of(state, nprocs: int, ranks: list = ()) -> RankError:
    """The :class:`RankError` for a failed rank (``state``: its ``_rank_pipes.Rank``): its
    exception and traceback, or (none came back) how it ended and the last lines it wrote;
    then what became of the other ``ranks``."""
    from course_lib.launcher import _diagnose
    stderr = "\n".join(state.err_tail)
    raw = "\n".join(state.dump)
    state.dump_shown = True
    ended = ending(state.exitcode)
    if state.outcome and state.outcome[0] == "error":
        _, exc_type, message, tb = state.outcome
        return RankError(state.rank, nprocs, exc_type, message, tb,
                         _diagnose.summary(state.rank, message, stderr), raw, ended=ended,
                         others=_others(state, ranks))
    how = ended or "ended (its exit status had not arrived yet)"
    said = _diagnose.summary(state.rank, "", stderr)
    return RankError(state.rank, nprocs, "ProcessDied", f"the process {how} before returning",
                     "(no Python traceback: the process ended abruptly)",
                     said, raw or (stderr if said else ""), last_lines="\n".join(state.said),
                     others=_others(state, ranks))


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
