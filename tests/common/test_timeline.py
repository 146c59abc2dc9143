"""The per-rank timeline: Chrome-trace format, one band of rows per rank, spans from real ranks.

The real-rank test checks what no formula can give: a blocking all-reduce cannot finish on one
rank before its partner has entered it, so the two ranks' spans must overlap on the shared
clock, although rank 1 enters 0.2 s late; and the async bucket all-reduces DDP issues inside
``backward`` are all seen (as many as the byte counter of chapter 3 counts), each ending after
it was issued.
"""
from __future__ import annotations

import json
import time

import matplotlib
import pytest
import torch
import torch.distributed as dist

import course_lib
from course_lib.common.show import plot_timeline, timeline_rows
from course_lib.common.timeline import Span, Timeline, chrome_trace, lane_slots, merge

matplotlib.use("Agg")


def _spans(world: int) -> list[Span]:
    out = []
    for r in range(world):
        out += [Span(r, "compute", "forward", 1.0, 1.01), Span(r, "compute", "backward", 1.01, 1.05),
                Span(r, "comm", "all_reduce", 1.02, 1.04), Span(r, "comm", "all_reduce", 1.03, 1.06)]
    return out


def test_chrome_trace_is_valid_trace_event_json_one_pid_per_rank():
    trace = json.loads(json.dumps(chrome_trace(_spans(2))))
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 8
    assert {e["pid"] for e in complete} == {0, 1}
    first = min(complete, key=lambda e: e["ts"])
    assert first["ts"] == 0 and first["dur"] == pytest.approx(10_000)      # µs
    backward = next(e for e in complete if e["name"] == "backward")
    assert backward["ts"] == pytest.approx(10_000) and backward["dur"] == pytest.approx(40_000)
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    # spans on one thread never overlap: the two all-reduces in flight get two threads
    for pid in (0, 1):
        by_tid: dict = {}
        for e in complete:
            if e["pid"] == pid:
                by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
        assert len(by_tid) == 3
        for spans in by_tid.values():
            spans.sort()
            assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))


def test_lane_slots_pack_overlaps_apart():
    spans = merge(_spans(1))
    assert lane_slots(spans) == [0, 0, 0, 1]


@pytest.mark.parametrize("world", [2, 4])
def test_the_figure_has_one_band_of_rows_per_rank(world):
    fig = plot_timeline(_spans(world))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == 2 * world
    assert {label.split(" · ")[0] for label in labels} == {f"rank {r}" for r in range(world)}
    assert timeline_rows(_spans(world))[:2] == [(0, "compute"), (0, "comm")]
    matplotlib.pyplot.close(fig)


def test_an_empty_timeline_says_why():
    with pytest.raises(ValueError, match="no spans"):
        plot_timeline([])


def _traced_rank() -> dict:
    from course_lib.sharding.comm_counter import CommCounter
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)]), bucket_cap_mb=0.25)
    for _ in range(2):                       # DDP rebuilds its buckets after the first step
        model(torch.randn(8, 256)).sum().backward()
    x = torch.ones(1000)
    with Timeline() as tl, CommCounter() as counter:
        if rank == 1:
            time.sleep(0.2)                  # rank 0 waits inside the all-reduce
        with tl.span("blocking"):
            dist.all_reduce(x)
        with tl.span("backward"):
            model(torch.randn(8, 256)).sum().backward()
    return {"events": tl.events(), "calls": len(counter.calls), "x": x[0].item()}


def test_real_ranks_spans_overlap_and_every_bucket_is_seen():
    results = course_lib.run(_traced_rank, 2)
    assert [r["x"] for r in results] == [2.0, 2.0]
    comm = [[s for s in r["events"] if s.lane == "comm"] for r in results]
    for rank, r in enumerate(results):
        assert len(comm[rank]) == r["calls"] >= 3       # 1 all-reduce + DDP's buckets
        assert all(s.rank == rank and s.t1 >= s.t0 for s in r["events"])
    first = [c[0] for c in comm]
    assert first[0].name == first[1].name == "all_reduce"
    assert first[0].t0 < first[1].t0 - 0.1              # rank 0 entered first ...
    assert first[0].t1 > first[1].t0                    # ... and left after rank 1 entered
    # every bucket all-reduce of rank 0 overlaps the same bucket's on rank 1
    for a, b in zip(comm[0][1:], comm[1][1:]):
        assert a.t0 < b.t1 and b.t0 < a.t1
    backward = next(s for s in results[0]["events"] if s.name == "backward")
    assert any(backward.t0 < s.t0 < backward.t1 for s in comm[0][1:])   # issued inside backward


def test_events_waits_for_the_end_time_of_a_collective_that_has_finished():
    """A collective's future can be done while the callback that stamps its end still runs in
    gloo's thread (DDP returns from backward first): events() waits for that stamp instead of
    leaving the collective out. The thread here stamps 0.2 s late, as a slow callback would."""
    import threading

    tl = Timeline(rank=0)
    record = ["comm", "all_reduce", time.perf_counter(), None]
    work, stamped = torch.futures.Future(), torch.futures.Future()
    work.set_result(None)  # the collective itself is done

    def stamp():
        time.sleep(0.2)
        record[3] = time.perf_counter()
        stamped.set_result(None)

    tl._records.append(record)
    tl._pending.append((work, stamped))
    threading.Thread(target=stamp, daemon=True).start()
    assert [(s.lane, s.name) for s in tl.events()] == [("comm", "all_reduce")]
    in_flight = Timeline(rank=0)  # a collective not yet done is left out, without waiting
    in_flight._records.append(["comm", "all_reduce", time.perf_counter(), None])
    in_flight._pending.append((torch.futures.Future(), torch.futures.Future()))
    assert in_flight.events() == []
