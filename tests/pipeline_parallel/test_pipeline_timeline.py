"""Pipeline traces become per-rank timeline spans with the schedules' names (no ranks needed)."""
from types import SimpleNamespace

import pytest

from course_lib.pipeline_parallel.timeline import pipeline_spans, torch_schedule_spans


def test_hand_schedule_traces_become_compute_and_recv_spans():
    traces = [SimpleNamespace(rank=0, events=[("F", 0, 0.0, 0.1), ("B", 0, 0.3, 0.5)],
                              waits=[("B", 0, 0.1, 0.3), ("F", 1, 0.5, 0.5)]),
              SimpleNamespace(rank=1, events=[("F", 0, 0.1, 0.2), ("B", 0, 0.2, 0.3)],
                              waits=[("F", 0, 0.0, 0.1)])]
    spans = pipeline_spans(SimpleNamespace(traces=traces))
    assert [(s.rank, s.lane, s.name) for s in spans] == [
        (0, "compute", "F 0"), (0, "compute", "B 0"), (0, "comm", "recv B0"),
        (1, "compute", "F 0"), (1, "compute", "B 0"), (1, "comm", "recv F0")]


def test_torch_actions_are_named_by_letter_and_stage():
    result = {"actions": [[("forward_one_chunk@0", 0.0, 0.1), ("backward_weight_one_chunk@3", 0.2, 0.3)],
                          [("backward_one_chunk@1", 0.1, 0.2)]]}
    spans = torch_schedule_spans(result)
    assert [(s.rank, s.name) for s in spans] == [(0, "F 0"), (0, "W 3"), (1, "B 1")]
    with pytest.raises(ValueError, match="no recorded actions"):
        torch_schedule_spans({"bubble": 0.1})
