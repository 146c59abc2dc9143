"""A DDP step under torch.profiler (chapter 05): the trace read back holds each bucket's all-reduce
on gloo's worker threads and backward on the training thread; overlap is read from the spans."""
import json

import pytest

from course_lib.common.timeline import Span
from course_lib.communication.profiling import overlap, profiled_ddp_step, trace_spans
from course_lib.data_parallel.timeline import ddp_timeline
from course_lib.launcher.launch import run


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    return run(profiled_ddp_step, 2, trace_dir=str(folder), threads=1)


def test_the_trace_holds_every_bucket_and_every_backward_node(traces):
    timeline = ddp_timeline(nprocs=2, bucket_cap_mb=1)   # the course's tracer, independent of the profiler
    buckets = sum(1 for s in timeline if s.rank == 0 and s.lane == "comm")
    for rank, path in enumerate(traces):
        spans = trace_spans(path, rank)
        assert sum(1 for s in spans if s.lane == "comm") == buckets
        assert all(s.name == "all_reduce" for s in spans if s.lane == "comm")
        assert sum(1 for s in spans if s.name == "backward AddmmBackward0") == 6   # six Linear layers
        assert sum(1 for s in spans if s.name == "forward linear") == 6


def test_ddp_issues_buckets_inside_backward(traces):
    """DDP hands a bucket to gloo (c10d::allreduce_ on the training thread) before backward ends."""
    for rank, path in enumerate(traces):
        events = [e for e in json.loads(open(path).read())["traceEvents"] if e.get("ph") == "X"]
        spans = trace_spans(path, rank)
        backward_end = max(s.t1 for s in spans if s.name.startswith("backward")) * 1e6
        issued = sorted(float(e["ts"]) for e in events if e["name"] == "c10d::allreduce_")
        assert issued and issued[0] < backward_end


def test_overlap_splits_communication_at_the_end_of_backward():
    spans = [Span(0, "compute", "backward a", 1.0, 2.0), Span(0, "compute", "backward b", 2.0, 3.0),
             Span(0, "comm", "all_reduce", 2.5, 3.5), Span(0, "comm", "all_reduce", 0.5, 1.5)]
    o = overlap(spans)[0]
    assert o == pytest.approx({"comm": 2.0, "hidden": 1.0, "exposed": 1.0})
    with pytest.raises(ValueError, match="rank 0"):
        overlap([Span(0, "compute", "forward a", 0.0, 1.0), Span(0, "comm", "all_reduce", 0.0, 1.0)])


def test_a_trace_without_events_is_refused(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="no complete events"):
        trace_spans(empty, 0)
