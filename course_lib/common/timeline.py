"""A per-rank timeline: what each rank computed and communicated, when, recorded from outside.

Each event is a :class:`Span` ``(rank, lane, name, t0, t1)`` in seconds of ``time.perf_counter``,
which on Linux reads ``CLOCK_MONOTONIC``: one clock for every process of the machine, so spans of
forked ranks line up without any synchronisation. :class:`Timeline` is a ``TorchDispatchMode``
(like chapter 3's byte counter): every c10d collective dispatched while it is active (also the
ones DDP's reducer and FSDP2 issue inside ``backward``) becomes a "comm" span from the call to
the moment gloo completes its ``Work`` (a callback on the work's future, run by gloo's thread) —
the real end of an async bucket all-reduce, which ``torch.profiler`` cannot tie to its call
(docs/decisions/timelines-and-figures.md, "Why the course records collectives with its own tracer,
not torch.profiler"). Compute is marked by the harness with ``span()``.
:func:`chrome_trace` writes the Chrome-trace JSON that Perfetto and chrome://tracing open.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Span", "Timeline", "spans_from", "merge", "lane_slots", "chrome_trace",
           "save_chrome_trace"]

LANES = ("compute", "comm")
_FRIENDLY = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all"}


def lane_order(lane: str) -> int:
    """Where ``lane`` sorts among a rank's rows: compute, comm, then any other."""
    return LANES.index(lane) if lane in LANES else len(LANES)


class Span(NamedTuple):
    """One thing a rank did: ``lane`` is "compute" or "comm"; times in perf_counter seconds."""

    rank: int
    lane: str
    name: str
    t0: float
    t1: float


def _collective_name(op: str) -> str:
    """c10d operator -> the collective's name: ``_allgather_base_`` -> ``all_gather``."""
    name = op.strip("_")
    for suffix in ("_coalesced", "_base", "_into_tensor", "_tensor"):
        name = name.replace(suffix, "")
    return _FRIENDLY.get(name, name)


def _work(out) -> object | None:
    """The ``Work`` a c10d operator returned (alone or last in a tuple), unboxed; else None."""
    candidate = out[-1] if isinstance(out, (tuple, list)) and out else out
    if not isinstance(candidate, torch.ScriptObject):
        return None
    try:
        return torch._C._distributed_c10d.Work.unbox(candidate)
    except (RuntimeError, TypeError, AttributeError):
        return None


class Timeline(TorchDispatchMode):
    """Records this rank's collectives while active (``with Timeline() as tl:``) and the
    compute spans marked with :meth:`span`; :meth:`events` lists the finished ones."""

    def __init__(self, rank: int | None = None) -> None:
        super().__init__()
        if rank is None:
            import torch.distributed as dist
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = rank
        self._records: list[list] = []   # [lane, name, t0, t1 or None]; t1 set by gloo's thread
        self._pending: list[tuple] = []  # (work's future, the future of its end-time callback)

    @contextmanager
    def span(self, name: str, lane: str = "compute") -> Iterator[None]:
        """Mark the code inside as one span of ``lane`` (the harness's forward, backward, ...)."""
        record = [lane, str(name), time.perf_counter(), None]
        self._records.append(record)
        try:
            yield
        finally:
            record[3] = time.perf_counter()

    def watch(self, modules: Iterable[tuple[str, torch.nn.Module]]) -> list:
        """Time each ``(name, module)``'s forward and backward as compute spans ("forward
        name", "backward name") with module hooks; returns the hook handles (``.remove()``)."""
        handles: list = []
        open_: dict = {}

        def begin(kind, name, *_):
            open_[(kind, name)] = time.perf_counter()

        def end(kind, name, *_):
            if (t0 := open_.pop((kind, name), None)) is not None:
                self._records.append(["compute", f"{kind} {name}", t0, time.perf_counter()])
        for name, module in modules:
            handles += [module.register_forward_pre_hook(partial(begin, "forward", name)),
                        module.register_forward_hook(partial(end, "forward", name)),
                        module.register_full_backward_pre_hook(partial(begin, "backward", name)),
                        module.register_full_backward_hook(partial(end, "backward", name))]
        return handles

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        schema = getattr(func, "_schema", None)
        space, _, op = schema.name.partition("::") if schema is not None else ("", "", "")
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        work = _work(out) if space == "c10d" else None
        if work is not None:
            record = ["comm", _collective_name(op), start, None]
            self._records.append(record)
            try:
                future = work.get_future()
            except RuntimeError:     # gloo's reduce-scatter: no future, it completes in wait()
                work.wait()
                record[1:] = [f"{record[1]} (waited at its call)", start, time.perf_counter()]
                return out
            stamped = future.then(lambda f, rec=record: rec.__setitem__(3, time.perf_counter()))
            self._pending.append((future, stamped))
        return out

    def events(self) -> list[Span]:
        """Every finished span (a collective still in flight is left out), in start order."""
        for future, stamped in self._pending:
            if future.done():    # finished, but its callback may still be on its way in gloo's
                stamped.wait()   # thread: DDP can return from backward before it runs
        done = [Span(self.rank, lane, name, t0, t1) for lane, name, t0, t1 in list(self._records)
                if t1 is not None]
        return sorted(done, key=lambda s: s.t0)

    def reset(self) -> None:
        """Forget what was recorded so far (e.g. after a warm-up step)."""
        self._records, self._pending = [], []


def spans_from(rank: int, lane: str, items: Iterable[tuple]) -> list[Span]:
    """Spans from ``(name, t0, t1)`` triples already timed on the perf_counter clock."""
    return [Span(rank, lane, str(name), float(t0), float(t1)) for name, t0, t1 in items]


def merge(*groups: Iterable[Span], origin: float | None = None) -> list[Span]:
    """All ranks' spans in one list, times shifted so that ``origin`` (default: the earliest
    start) is 0, sorted by rank, lane and start."""
    spans = [Span(*s) for group in groups for s in group]
    zero = min((s.t0 for s in spans), default=0.0) if origin is None else origin
    shifted = [s._replace(t0=s.t0 - zero, t1=s.t1 - zero) for s in spans]
    return sorted(shifted, key=lambda s: (s.rank, lane_order(s.lane), s.t0))


def lane_slots(spans: Iterable[Span]) -> list[int]:
    """For each span, a row within its (rank, lane) so that spans on one row never overlap
    (two bucket all-reduces in flight at once get two rows): greedy, in start order."""
    spans = list(spans)
    ends: dict[tuple, list[float]] = {}
    slots = [0] * len(spans)
    for k in sorted(range(len(spans)), key=lambda k: spans[k].t0):
        s = spans[k]
        rows = ends.setdefault((s.rank, s.lane), [])
        free = next((j for j, end in enumerate(rows) if end <= s.t0), len(rows))
        if free == len(rows):
            rows.append(s.t1)
        rows[free] = s.t1
        slots[k] = free
    return slots


def chrome_trace(spans: Iterable[Span]) -> dict:
    """The Chrome trace-event format (``{"traceEvents": [...]}``): one process per rank, one
    thread per lane (and per row of overlapping spans), complete events ``ph: "X"`` with
    ``ts``/``dur`` in microseconds. Opens in ui.perfetto.dev and chrome://tracing."""
    spans = merge(spans)
    slots = lane_slots(spans)
    events, named = [], set()
    for s, slot in zip(spans, slots):
        tid = 10 * lane_order(s.lane) + slot
        if s.rank not in {p for p, _ in named}:
            events.append({"name": "process_name", "ph": "M", "pid": s.rank, "tid": 0,
                           "args": {"name": f"rank {s.rank}"}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": s.rank, "tid": 0,
                           "args": {"sort_index": s.rank}})
        if (s.rank, tid) not in named:
            named.add((s.rank, tid))
            label = s.lane if slot == 0 else f"{s.lane} ({slot + 1})"
            events.append({"name": "thread_name", "ph": "M", "pid": s.rank, "tid": tid,
                           "args": {"name": label}})
        events.append({"name": s.name, "cat": s.lane, "ph": "X", "pid": s.rank, "tid": tid,
                       "ts": round(s.t0 * 1e6, 3), "dur": round(max(s.t1 - s.t0, 0.0) * 1e6, 3)})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def save_chrome_trace(spans: Iterable[Span], path: str | Path) -> Path:
    """Write :func:`chrome_trace` to ``path`` (a ``.json`` file) and return the path."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(spans)))
    return path
