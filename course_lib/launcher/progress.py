"""Live progress and folded rank logs for long runs in a notebook (used by every chapter).

A run still going after ~2 s shows one line: what runs, for how long, how far it got (ranks
finished k/N; steps reported with :func:`report`). Beyond ~20 lines of rank output the rest is
folded per rank into a collapsed ``<details>`` block with a live tail. :func:`course_lib.run` and
:func:`course_lib.torchrun` use it; long widget callbacks and benchmarks use :func:`running`.

It shows only where a person watches (a kernel request with ``allow_stdin=True``); under nbval,
``nbconvert --execute``, pytest and scripts every line passes through unchanged, so stored
outputs stay reproducible. ``COURSE_PROGRESS=0`` turns it off, ``=1`` forces it on in a kernel.
"""
from __future__ import annotations

import contextvars
import html
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TextIO

__all__ = ["running", "report", "watch", "emit", "interactive", "fold", "View"]

DELAY_S = 2.0   # runs shorter than this show nothing extra
HEAD = 20       # lines streamed as usual before the rest is folded
TAIL = 5        # newest folded lines shown live while the run goes on
# A rank's progress report travels as one stdout line wrapped in an OSC escape sequence, which a
# terminal ignores if the line ever reaches one; the parent takes it out of the output.
_MARKER = re.compile(r"^\x1b\]course-progress;(\d+)/(\d*)\x07$")
_CURRENT: contextvars.ContextVar["View | None"] = contextvars.ContextVar("course_progress",
                                                                         default=None)


def interactive() -> bool:
    """True in an IPython kernel whose current request allows ``input()`` (a person watches)."""
    setting = os.environ.get("COURSE_PROGRESS", "")
    if setting == "0":
        return False
    kernel = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    kernel = getattr(kernel, "kernel", None)
    return kernel is not None and (setting == "1" or bool(getattr(kernel, "_allow_stdin", False)))


def report(done: int, total: int | None = None) -> None:
    """Inside a rank: tell the notebook how far this rank got (e.g. ``report(step, steps)``).

    Works inside :func:`course_lib.run` and :func:`course_lib.torchrun`; elsewhere (a script
    started alone or by a plain ``torchrun``) it does nothing. Call it on rank 0 once per step.
    """
    if ("course_lib.launcher._worker" in sys.modules
            or os.environ.get("COURSE_PROGRESS_CHANNEL") == "1"):
        sys.stdout.write(f"\x1b]course-progress;{int(done)}/{'' if total is None else int(total)}"
                         "\x07\n")
        sys.stdout.flush()


def prefix(rank: int | None) -> str:
    return "[torchrun] " if rank is None else f"[rank {rank}] "


def fold(lines: Sequence[tuple[int | None, str]], head: int = HEAD) -> dict[int | None, list[str]]:
    """What folds: the lines after the first ``head`` (arrival order, shown as streamed), per rank."""
    hidden: dict[int | None, list[str]] = {}
    for rank, text in lines[head:]:
        hidden.setdefault(rank, []).append(text)
    return hidden


def render_fold(hidden: dict[int | None, list[str]]) -> str:
    """HTML: one collapsed ``<details>`` per rank, its summary naming the count and last line."""
    blocks = []
    for rank in sorted(hidden, key=lambda r: -1 if r is None else r):
        texts = hidden[rank]
        who = prefix(rank).strip()
        last = html.escape(texts[-1][:120])
        blocks.append(f"<details><summary>{who}: {len(texts)} more line"
                      f"{'s' * (len(texts) != 1)} · last: <code>{last}</code></summary>"
                      f"<pre>{html.escape(chr(10).join(texts))}</pre></details>")
    return "".join(blocks)


def status_line(what: str, elapsed: float, done: int | None, total: int | None, unit: str,
                note: str, state: str) -> str:
    """HTML for the one line: what runs, seconds, a bar when the total is known, a note."""
    icon = {"running": "⏳", "done": "✔", "failed": "✖"}[state]
    parts = [f"{icon} <b>{html.escape(what)}</b>", f"{elapsed:.1f} s"]
    if total:
        parts.append(f"<progress value='{done or 0}' max='{total}' style='width:8em'></progress> "
                     f"{done or 0}/{total} {html.escape(unit)}")
    if note:
        parts.append(html.escape(note))
    return " · ".join(parts)


class View:
    """What one run shows while it goes on; silent (lines pass through) unless ``live``."""

    def __init__(self, what: str, total: int | None, unit: str, delay: float, head: int,
                 live: bool, outer: "View | None" = None):
        self.what, self.total, self.unit, self.delay, self.head = what, total, unit, delay, head
        self.live, self.outer = live, outer
        self.start, self.done, self.note = time.monotonic(), None, ""
        self.lines: list[tuple[int | None, str]] = []
        self._target, self._drawn, self._lock = None, 0.0, threading.RLock()

    @property
    def wait(self) -> float:
        """How long the owner's loop may block between two :meth:`tick` calls."""
        return 0.25 if self.live else 1.0

    def line(self, rank: int | None, text: str, stream: TextIO | None = None,
             echo: bool = True) -> bool:
        """One output line of ``rank``; False if it was a progress report (not output)."""
        if mark := _MARKER.match(text):
            total = int(mark.group(2)) if mark.group(2) else None
            self.update(note=f"step {mark.group(1)}{'/' + str(total) if total else ''}"
                             f" ({prefix(rank).strip()[1:-1]})")
            return False
        if not echo:
            return True
        with self._lock:
            if self.outer is not None:
                return self.outer.line(rank, text, stream)
            if self.live:
                self.lines.append((rank, text))
                if len(self.lines) > self.head:
                    self._draw()
                    return True
            stream = stream or sys.stdout
            stream.write(prefix(rank) + text + "\n")
            stream.flush()
        return True

    def update(self, done: int | None = None, note: str | None = None) -> None:
        """Record progress (cheap; drawn on the next tick)."""
        with self._lock:
            self.done = self.done if done is None else done
            self.note = self.note if note is None else note
            if self.outer is not None:
                bits = [f"{self.done}/{self.total} {self.unit}" if self.total else "", self.note]
                self.outer.update(note=f"{self.what}: " + " · ".join(b for b in bits if b))

    def tick(self) -> None:
        """Show or refresh the line once the run has lasted ``delay`` seconds."""
        if self.live and time.monotonic() - self.start >= self.delay:
            self._draw()

    def close(self, state: str) -> None:
        """Turn the live line into a one-line summary and the folded lines into ``<details>``."""
        with self._lock:
            elapsed = time.monotonic() - self.start
            folded = fold(self.lines, self.head)
            if not self.live or (self._target is None and not folded and elapsed < self.delay):
                return
            summary = status_line(self.what, elapsed, self.done, self.total, self.unit,
                                  self.note, state)
            self._show(summary + render_fold(folded))

    def _draw(self) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._drawn < 0.2:
                return
            self._drawn = now
            body = status_line(self.what, now - self.start, self.done, self.total, self.unit,
                               self.note, "running")
            count = len(self.lines) - self.head
            if count > 0:
                newest = self.lines[max(self.head, len(self.lines) - TAIL):]
                tail = [prefix(r) + t for r, t in newest]
                body += (f"<br>{count} more line{'s' * (count != 1)}, folded per rank when the "
                         f"run ends; newest:<pre>{html.escape(chr(10).join(tail))}</pre>")
            self._show(body)

    def _show(self, markup: str) -> None:
        # the class lets a test tell progress from what a widget shows
        markup = f"<div class='course-progress' style='font-size:0.9em'>{markup}</div>"
        try:
            if self._target is None:
                self._target = _target(markup)
            else:
                self._target(markup)
        except Exception:  # noqa: BLE001 - a display problem must never break a run
            self.live = False


def _target(markup: str) -> Callable[[str], None]:
    """Show ``markup`` where the view draws; returns how to redraw it: a display handle in a cell,
    an ``ipywidgets.HTML`` in a widget callback (an ``Output`` widget, which ``interact`` uses,
    ignores display updates)."""
    from IPython.display import HTML, display
    kernel = sys.modules["IPython"].get_ipython().kernel
    parent = kernel.get_parent() if hasattr(kernel, "get_parent") else {}
    if parent.get("header", {}).get("msg_type", "execute_request") == "execute_request":
        handle = display(HTML(markup), display_id=True)
        return lambda new: handle.update(HTML(new))
    import ipywidgets
    widget = ipywidgets.HTML(markup)
    display(widget)
    return lambda new: setattr(widget, "value", new)


@contextmanager
def watch(what: str, total: int | None = None, unit: str = "ranks done", *,
          delay: float = DELAY_S, head: int = HEAD) -> Iterator[View]:
    """The view of one run, for a launcher whose own loop calls :meth:`View.tick`; inside
    another view (a run inside :func:`running`) its lines and progress go to the outer one."""
    outer = _CURRENT.get()
    view = View(what, total, unit, delay, head, live=outer is None and interactive(),
                outer=outer)
    token = _CURRENT.set(view)
    state = "failed"
    try:
        yield view
        state = "done"
    finally:
        _CURRENT.reset(token)
        view.close(state)
        if outer is not None:
            outer.update(note="")


@contextmanager
def running(what: str, total: int | None = None, unit: str = "steps", *,
            delay: float = DELAY_S) -> Iterator[View]:
    """A live line for a long block of notebook code: ``with running("bench", total=n) as p:
    ... p.update(done=k)``; a thread refreshes the time, runs inside report into the same line."""
    with watch(what, total, unit, delay=delay) as view:
        stop = threading.Event()

        def loop() -> None:  # ends at once where nobody watches
            while view.live and not stop.wait(0.25):
                view.tick()
        ticker = threading.Thread(target=contextvars.copy_context().run, args=(loop,), daemon=True)
        ticker.start()
        try:
            yield view
        finally:
            stop.set()
            ticker.join()


def emit(text: str, rank: int | None, stream: TextIO) -> bool:
    """Route one rank line through the current view (plain ``[rank r] ...`` when there is none)."""
    return (_CURRENT.get() or _PLAIN).line(rank, text, stream)


_PLAIN = View("", None, "", DELAY_S, HEAD, live=False)  # no view: lines pass, reports vanish
