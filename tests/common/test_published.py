"""Published GPU-scale figures and the optional GPU run (chapters 02, 04, 05, 09)."""
from __future__ import annotations

import json

import pytest

from course_lib.common.published import (format_published, gpu_reference, published,
                                         show_published)


@pytest.mark.parametrize("chapter", ["02", "04", "05", "09"])
def test_every_speed_chapter_has_sourced_figures(chapter):
    entries = published(chapter)
    assert entries
    for e in entries:
        assert e["url"].startswith("https://") and e["source"]
        assert all(len(row) == len(e["columns"]) for row in e["rows"])
    assert format_published(chapter).startswith("Published, not measured here:")


def test_without_a_gpu_file_nothing_is_printed_for_it(tmp_path, capsys):
    show_published("04", "bubble", gpu_path=tmp_path / "absent.json")
    out = capsys.readouterr().out
    assert "Published, not measured here" in out and "gpu_reference.py" not in out


def test_a_gpu_file_is_shown_with_its_gpu_date_and_versions(tmp_path, capsys):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"meta": {"gpu": "NVIDIA H200", "date": "2026-12-02", "torch": "2.13",
                                         "nccl": "2.27.3"},
                                "experiments": {"bubble": {"lines": ["gpipe m=8: bubble 0.12"]}}}))
    show_published("04", "bubble", gpu_path=path)
    out = capsys.readouterr().out
    assert "on NVIDIA H200 (2026-12-02, torch 2.13, NCCL 2.27.3), not on this machine" in out
    assert "gpipe m=8: bubble 0.12" in out
    assert gpu_reference("overlap", path) is None


def test_a_malformed_file_is_refused_with_the_field_named(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"meta": {"gpu": "x"}, "experiments": {"bubble": {}}}))
    with pytest.raises(ValueError, match="'meta' must name"):
        gpu_reference("bubble", path)
    bad = tmp_path / "pub.json"
    bad.write_text(json.dumps({"entries": [{"id": "x", "chapters": ["04"]}]}))
    with pytest.raises(ValueError, match="an entry lacks"):
        published("04", bad)
