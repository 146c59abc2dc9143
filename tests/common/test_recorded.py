"""The stored speed runs (data/speed_lessons.json): plain JSON, checked, labelled, used only
where the live run cannot show its effect (fewer usable cores, no network namespaces)."""
from __future__ import annotations

import json

import pytest

from course_lib.common import recorded
from course_lib.common import machine
from course_lib.launcher.netns import LinkUnavailable

NOTEBOOK_FIELDS = {
    "overlap": ("compute_s", "comm_s", "step_overlapped_s", "step_serial_s", "exposed_comm_s"),
    "scaling_over_link": ("rate_mbit", "t1_s", "t2_s", "speedup", "predicted_speedup_serial",
                          "predicted_speedup_overlap", "core_share"),
}


@pytest.mark.parametrize("name", sorted(NOTEBOOK_FIELDS))
def test_the_stored_runs_hold_what_the_notebooks_read_and_say_where_they_come_from(name):
    value, label = recorded.load_record(name, NOTEBOOK_FIELDS[name])
    assert label.startswith("RECORDED, not measured here") and "usable cores" in label
    assert "load" in label and "benchmarks/record_speed_lessons.py" in label


def test_a_record_without_a_field_or_a_machine_is_refused(tmp_path):
    path = tmp_path / "speed.json"
    recorded.save_record("x", {"a": 1.0}, {"cpu": "c", "cores": 2, "date": "d",
                                           "load_1min": 0.1, "command": "cmd"}, path)
    assert recorded.load_record("x", ("a",), path)[0] == {"a": 1.0}
    with pytest.raises(ValueError, match=r"lacks the fields \['b'\]"):
        recorded.load_record("x", ("a", "b"), path)
    path.write_text(json.dumps({"x": {"value": {"a": 1}, "meta": {"cpu": "c"}}}))
    with pytest.raises(ValueError, match="no machine description"):
        recorded.load_record("x", ("a",), path)
    with pytest.raises(ValueError, match="no record named 'y'"):
        recorded.load_record("y", (), path)


def test_one_usable_core_shows_the_stored_run_and_says_why(monkeypatch):
    monkeypatch.setattr(machine, "usable_cores", lambda *a: 1)
    value, source = recorded.live_or_recorded(
        "overlap", lambda: pytest.fail("measured on one core"), NOTEBOOK_FIELDS["overlap"])
    assert "needs 2 usable cores" in source and "may use 1" in source
    assert "RECORDED, not measured here" in source and "comm_s" in value


def test_no_namespace_shows_the_stored_run_with_the_reason(monkeypatch):
    monkeypatch.setattr(machine, "usable_cores", lambda *a: 2)

    def refused():
        raise LinkUnavailable("unprivileged user namespaces are off here")
    value, source = recorded.live_or_recorded("scaling_over_link", refused,
                                              NOTEBOOK_FIELDS["scaling_over_link"],
                                              unavailable=(LinkUnavailable,))
    assert "user namespaces are off" in source and isinstance(value, list)
