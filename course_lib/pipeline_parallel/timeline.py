"""Pipeline schedules as they ran, as per-rank timelines (chapter 09's figures; a hand run too).

No new measurement: the hand-written schedules are already timed from outside by
:class:`~course_lib.pipeline_parallel.trace.TracedSteps` (each forward and backward, and the
time each receive blocked), torch's schedules by the wrapped ``forward_one_chunk`` /
``backward_one_chunk`` / ``backward_weight_one_chunk`` of
:mod:`~course_lib.pipeline_parallel.torch_schedules`, all on ``time.perf_counter``. These
functions turn them into :class:`~course_lib.common.timeline.Span` lists for
:func:`~course_lib.common.show.plot_timeline` and the Chrome-trace export.
"""
from __future__ import annotations

from course_lib.common.timeline import Span, spans_from

__all__ = ["pipeline_spans", "torch_schedule_spans", "ACTION_NAMES"]

#: torch's stage methods -> the letters the schedules' papers use
ACTION_NAMES = {"forward_one_chunk": "F", "backward_one_chunk": "B",
                "backward_weight_one_chunk": "W"}


def pipeline_spans(report) -> list[Span]:
    """A :class:`~course_lib.pipeline_parallel.measure.PipelineReport`'s step: "F i" / "B i"
    (micro-batch i) in the compute lane, "recv" (blocked waiting for a neighbour) in comm."""
    out: list[Span] = []
    for trace in report.traces:
        out += spans_from(trace.rank, "compute", ((f"{k} {i}", a, b) for k, i, a, b in trace.events))
        out += spans_from(trace.rank, "comm", ((f"recv {k}{i}", a, b) for k, i, a, b in trace.waits
                                               if b > a))
    return out


def torch_schedule_spans(result: dict) -> list[Span]:
    """A :func:`~course_lib.pipeline_parallel.torch_schedules.measure_torch_schedule` result's
    last step: "F s", "B s", "W s" (s = the stage the action ran on) per rank."""
    if "actions" not in result:
        raise ValueError("this result has no recorded actions: measure it with "
                         "measure_torch_schedule(s) from course_lib.pipeline_parallel.torch_schedules")
    out: list[Span] = []
    for rank, actions in enumerate(result["actions"]):
        named = []
        for name, a, b in actions:
            method, _, stage = name.partition("@")
            named.append((f"{ACTION_NAMES.get(method, method)} {stage}".strip(), a, b))
        out += spans_from(rank, "compute", named)
    return out
