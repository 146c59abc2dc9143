"""The one mechanism every chapter uses to check an exercise.

A check returns a :class:`Feedback` that prints as one friendly line. It never raises on a
wrong answer (so a notebook keeps running under ``Run all`` and under nbval) and it never prints
the expected value (so the output does not give the solution away): it says *how* the answer is
off — not answered yet, wrong type, too high, too low, wrong shape — and may add a hint.

Solutions live in the notebook, in a collapsed ``<details>`` block under each exercise. Tests call
the same checks with a wrong answer (must fail) and with the solution (must pass).

Used in every chapter; introduced in ``00_start_here.ipynb``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from course_lib.display import Folded

__all__ = ["Feedback", "check_number", "check_close", "check_choice", "check_true", "TODO",
           "failure_details"]

#: Put this (or ``...``) where the learner has to write an answer; checks treat it as "not yet".
TODO = ...


@dataclass(frozen=True)
class Feedback:
    """The outcome of one check: ``passed`` and a one-line message without the solution.

    ``details``: what the learner's failing code left (:func:`failure_details`: a rank's
    traceback and raw output, trimmed), shown below the line (folded behind a toggle in a notebook).
    """

    passed: bool
    message: str
    name: str = "exercise"
    details: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def _parts(self) -> tuple[str, str, str]:
        """(mark, colour, message): plain capitals, so pass and fail differ without an emoji font."""
        if self.passed:
            return "PASS", "#1a7f37", self.message
        if self.message.startswith(_UNANSWERED):
            return "TO DO", "#6e7781", self.message[len(_UNANSWERED):].lstrip(": ")
        return "NOT YET", "#cf222e", self.message

    def _folded(self) -> Folded:
        mark, _, message = self._parts()
        return Folded(f"[{self.name}] {mark}: {message}", self.details,
                      "what your code left: traceback and raw output")

    def __repr__(self) -> str:
        return repr(self._folded())

    __str__ = __repr__

    def _repr_html_(self) -> str:
        """A coloured badge with the line; a rank's raw output folded below it, if any."""
        import html
        mark, colour, message = self._parts()
        badge = (f'<div class="course-feedback"><span style="background:{colour};color:#fff;'
                 f'font-weight:bold;padding:0 0.4em;border-radius:3px">{mark}</span> '
                 f'<code>{html.escape(self.name)}</code> {html.escape(message)}</div>')
        return badge + self._folded()._repr_html_().split("</pre>", 1)[1]  # the fold, if any


_UNANSWERED = "not answered yet"


def _trim(text: str, head: int, tail: int) -> str:
    lines = text.rstrip().splitlines()
    if len(lines) > head + tail:
        lines = [*lines[:head], f"... ({len(lines) - head - tail} lines left out)", *lines[-tail:]]
    return "\n".join(line if len(line) <= 300 else line[:300] + " ..." for line in lines)


def failure_details(err: BaseException) -> str:
    """What a failed answer left, trimmed to read at a glance: for a rank that failed
    (:class:`~course_lib.launcher.RankError`) its traceback (the first 3 and last 20 lines) then
    what it wrote as it died (first 15, last 10); for an error raised here, its traceback."""
    import traceback
    if hasattr(err, "remote_traceback"):
        text = f"traceback from rank {err.rank}:\n{_trim(str(err.remote_traceback), 3, 20)}"
        if getattr(err, "ended", None):   # how it ended and its last lines (launcher, issue 57)
            text += f"\n\nrank {err.rank} {err.ended}"
        if getattr(err, "last_lines", None):
            text += f"\n\nits last lines:\n{_trim(str(err.last_lines), 0, 15)}"
        raw = str(getattr(err, "raw", "") or "")
        return text + (f"\n\nwhat rank {err.rank} wrote as it died:\n{_trim(raw, 15, 10)}"
                       if raw.strip() else "")
    return _trim("".join(traceback.format_exception(type(err), err, err.__traceback__)), 3, 20)


def _not_answered(answer: Any) -> bool:
    return answer is None or answer is Ellipsis


def _with_hint(message: str, hint: str) -> str:
    return f"{message} Hint: {hint}" if hint else message


def check_number(answer: Any, expected: float, *, rtol: float = 0.0, atol: float = 0.0,
                 name: str = "exercise", unit: str = "", hint: str = "") -> Feedback:
    """Compare a numeric answer with ``expected`` within ``atol + rtol*|expected|``.

    The message says "too high" or "too low" but never the expected value itself.
    """
    if _not_answered(answer):
        return Feedback(False, "not answered yet: replace `...` with your answer and run the cell.", name)
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"expected a number, got {type(answer).__name__}.", name)
    if math.isnan(answer):
        return Feedback(False, "your answer is NaN.", name)
    tol = atol + rtol * abs(expected)
    if abs(answer - expected) <= tol:
        shown = f"{answer:,}" if isinstance(answer, int) else f"{answer:.6g}"
        return Feedback(True, f"{shown}{(' ' + unit) if unit else ''} matches the measurement.", name)
    direction = "too high" if answer > expected else "too low"
    if expected and any(math.isclose(answer / expected, f) for f in (2.0, 0.5)):
        direction += " by exactly a factor of 2"
    return Feedback(False, _with_hint(f"{direction}.", hint), name)


def check_close(answer: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None,
                name: str = "exercise", hint: str = "") -> Feedback:
    """Compare tensors (or nested lists/dicts of them) with :func:`torch.testing.assert_close`.

    On failure the message keeps torch's description of *where* they differ (shape, dtype,
    number of mismatched elements, greatest difference) but drops the expected values.
    """
    if _not_answered(answer):
        return Feedback(False, "not answered yet: replace `...` with your code and run the cell.", name)
    try:
        torch.testing.assert_close(answer, expected, rtol=rtol, atol=atol)
    except (AssertionError, TypeError, ValueError) as err:
        first = str(err).strip().splitlines()
        kept = [ln for ln in first if "expected" not in ln.lower() or "mismatch" in ln.lower()]
        return Feedback(False, _with_hint(" ".join(kept[:3]) or "values differ.", hint), name)
    return Feedback(True, "matches the reference.", name)


def check_choice(answer: Any, expected: Any, options: Sequence[Any], *, name: str = "exercise",
                 hint: str = "") -> Feedback:
    """Multiple choice: ``answer`` must be one of ``options`` and equal to ``expected``."""
    if _not_answered(answer):
        return Feedback(False, f"not answered yet: pick one of {list(options)}.", name)
    if answer not in options:
        return Feedback(False, f"{answer!r} is not one of {list(options)}.", name)
    if answer == expected:
        return Feedback(True, f"{answer!r} is right.", name)
    return Feedback(False, _with_hint(f"{answer!r} is not it.", hint), name)


def check_true(run: Callable[[], tuple[bool, str]], *, name: str = "exercise") -> Feedback:
    """Run a chapter-specific check that returns ``(passed, message)``; errors become feedback.

    Use it for exercises where the learner writes a function (e.g. gradient averaging) and the
    chapter's module compares it with the library version.
    """
    try:
        passed, message = run()
    except Exception as err:  # the learner's code failed: show why, not a traceback wall
        kind = getattr(err, "exc_type", type(err).__name__)  # a RankError carries the rank's type
        if kind == "NotImplementedError":
            return Feedback(False, "not answered yet: your function still raises "
                                   "NotImplementedError.", name)
        where = f" on rank {err.rank}" if hasattr(err, "rank") else ""
        if getattr(err, "summary", None):  # a recognised crash: its one line, the rest folded
            return Feedback(False, f"your code failed: {err.summary}", name, failure_details(err))
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return Feedback(False, f"your code raised {kind}{where}: {first}", name,
                        failure_details(err))
    return Feedback(bool(passed), message, name)
