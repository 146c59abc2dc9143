"""Stored tables: what the planner computes now, read back without planning, never overwritten."""
from __future__ import annotations

import json

import pytest

from course_lib.plan import stored
from course_lib.plan.planner import plan
from course_lib.plan.stored import PLANS_DIR, load_plan, plan_from_dict, plan_to_dict, save_plan, stored_plan

from tests.plan.test_planner import TINY

FILES = sorted(PLANS_DIR.glob("*.json"))


def test_a_plan_survives_json_and_a_file_is_never_overwritten(tmp_path):
    p = plan(TINY, gpus=2, gpus_per_node=2, seq_len=256)
    back = plan_from_dict(json.loads(json.dumps(plan_to_dict(p))))
    assert back.rows == p.rows and back.model == p.model and back.cluster == p.cluster
    assert str(back) == str(p)
    path = save_plan(p, tmp_path / "t.json", {"gpus": 2})
    assert load_plan(path).rows == p.rows
    with pytest.raises(FileExistsError):
        save_plan(p, path, {"gpus": 2})


def test_chapter_07s_table_is_stored():
    assert any(f.name.startswith("llama-3.1-8b_8gpu_8pn_h100-80gb_79.6gib_b16_s8192") for f in FILES)


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_a_stored_table_answers_without_planning_and_is_what_the_planner_computes_now(path, monkeypatch):
    data = json.loads(path.read_text())
    request = dict(data["request"])
    model = request.pop("model", None) or path.name.split("_")[0]  # save_plan's callers may leave it out
    monkeypatch.setattr(stored, "_MEMORY", {})

    def refuse(*args, **kwargs):
        raise AssertionError("a stored request was planned again")
    monkeypatch.setattr(stored, "plan", refuse)
    table = stored_plan(model, **request)
    assert table.rows and table.best is not None
    monkeypatch.undo()
    best = table.best
    now = plan(model, layouts=[best.layout], **request).rows[0]
    assert now.layout == best.layout and now.fits
    assert now.peak_gib == pytest.approx(best.peak_gib, rel=0.01)
