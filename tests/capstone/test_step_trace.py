"""Chapter 12's profiler reading: a step's time split into communication, matmul, optimizer,
other ops and Python, from the Chrome trace torch.profiler writes."""
from __future__ import annotations

import json

import pytest

from course_lib.capstone.trace import CATEGORIES, step_shares


def _event(name, ts, dur, cat="cpu_op", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_own_times_go_to_the_innermost_category_and_the_rest_is_python(tmp_path):
    events = [_event("ProfilerStep#2", 0, 1000, cat="user_annotation"),
              _event("aten::linear", 10, 300), _event("aten::addmm", 20, 250),   # 50 other, 250 mm
              _event("c10d::allreduce_", 400, 200), _event("aten::copy_", 410, 40),  # 200 comm
              _event("Optimizer.step#AdamW.step", 700, 200, cat="user_annotation"),
              _event("aten::mul_", 720, 100),                                      # 100 op + 100 py
              _event("aten::mm", 5000, 999),                                       # after the step
              _event("aten::mm", 10, 500, tid=2)]                                  # another thread
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = step_shares(path)
    us = {k: round(v * 1e6) for k, v in s.seconds.items()}
    assert us == {"communication": 200, "matmul": 250, "optimizer": 200, "other ops": 50,
                  "Python and launch": 300}
    assert s.step_s == pytest.approx(1e-3) and sum(s.seconds.values()) == pytest.approx(1e-3)
    assert set(CATEGORIES) == set(s.seconds)


def test_a_trace_without_a_step_is_refused(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [_event("aten::mm", 0, 5)]}))
    with pytest.raises(ValueError, match="no ProfilerStep"):
        step_shares(path)


def test_a_real_profiled_step_on_two_ranks_sees_collectives_and_matmuls(tmp_path):
    from course_lib import train_gpt
    trace = tmp_path / "step.json"
    train_gpt({"dp_shard": 2}, preset="tiny", steps=3, batch_size=8, eval_every=0, trace=trace)
    s = step_shares(trace)
    assert s.seconds["communication"] > 0 and s.seconds["matmul"] > 0
    assert s.seconds["optimizer"] > 0 and s.step_s > 0
