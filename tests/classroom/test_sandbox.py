"""The sandbox's cgroup code on both cgroup versions, and the refusal where no sandbox can be made.

This machine may have only one cgroup version (``stat -fc %T /sys/fs/cgroup``: ``cgroup2fs`` is
v2, ``tmpfs`` a v1 or hybrid layout); the other version's logic runs here against a fake cgroup
root folder holding the files the kernel would: the limits it writes, the kill it asks for, the
groups a dead grader left. The real hierarchy is used by ``test_hostile.py``.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

import tools.classroom.sandbox as sandbox
from tools.classroom.__main__ import main
from tools.classroom.sandbox import FIRST_UID, Sandbox

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="Sandbox chowns its folder: root only")


def _fake_v2(root, controllers="cpuset cpu io memory hugetlb pids", enabled="cpu memory pids"):
    root.mkdir(exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text(enabled + "\n")
    (root / "cgroup.procs").write_text("")
    return root


def _fake_v1(root):
    for c in ("memory", "pids", "cpu", "freezer"):
        (root / c).mkdir(parents=True)
        (root / c / "cgroup.procs").write_text("")
    return root


def test_v2_is_chosen_only_with_the_three_controllers_enabled(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "ROOT", _fake_v2(tmp_path / "v2"))
    assert sandbox._cgroup_roots() == {"v2": tmp_path / "v2"}
    monkeypatch.setattr(sandbox, "ROOT", _fake_v2(tmp_path / "nopids", "cpu memory", "cpu memory"))
    assert sandbox._cgroup_roots() is None
    monkeypatch.setattr(sandbox, "ROOT", _fake_v1(tmp_path / "v1"))
    assert set(sandbox._cgroup_roots()) == {"memory", "pids", "cpu", "freezer"}


@pytest.fixture
def box_in(tmp_path, monkeypatch):
    """A Sandbox made under a fake cgroup root (``make(root, **limits)``), its folder removed."""
    made = []

    def make(root, **limits):
        monkeypatch.setattr(sandbox, "ROOT", root)
        made.append(Sandbox(FIRST_UID + 999, **limits))
        return made[-1]
    yield make
    for box in made:
        shutil.rmtree(box.home, ignore_errors=True)


@needs_root
def test_v2_limits_are_written_and_the_group_is_killed_with_cgroup_kill(tmp_path, box_in):
    box = box_in(_fake_v2(tmp_path / "cg"), memory=3 << 30, pids=64, cpus=0.5)
    [group] = box.groups
    assert group.parent == tmp_path / "cg" and group.name.startswith("course_grade_")
    assert (group / "memory.max").read_text() == str(3 << 30)
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "pids.max").read_text() == "64"
    assert (group / "cpu.max").read_text() == "50000 100000"
    box.kill_all()
    assert (group / "cgroup.kill").read_text() == "1"   # v2: one write kills the group
    assert not (group / "freezer.state").exists()


@needs_root
def test_v1_limits_go_to_each_controllers_group(tmp_path, box_in):
    box = box_in(_fake_v1(tmp_path / "cg"), memory=1 << 30, pids=32, cpus=2.0)
    groups = {g.parent.name: g for g in box.groups}
    assert (groups["memory"] / "memory.limit_in_bytes").read_text() == str(1 << 30)
    assert (groups["pids"] / "pids.max").read_text() == "32"
    assert (groups["cpu"] / "cpu.cfs_quota_us").read_text() == "200000"
    box.kill_all()  # v1: the freezer group is frozen while its processes are killed
    assert (groups["freezer"] / "freezer.state").read_text() == "THAWED"
    assert not (groups["memory"] / "cgroup.kill").exists()


def test_a_dead_graders_v2_group_is_swept(tmp_path, monkeypatch):
    root = _fake_v2(tmp_path / "cg")
    monkeypatch.setattr(sandbox, "ROOT", root)
    dead, alive = root / "course_grade_999999999_61000", root / f"course_grade_{os.getpid()}_61001"
    for group in (dead, alive):
        group.mkdir()
        (group / "cgroup.procs").write_text("")
    assert sandbox.sweep_stale() == 1
    assert (dead / "cgroup.kill").read_text() == "1" and not (alive / "cgroup.kill").exists()


def test_the_command_refuses_untrusted_work_without_a_sandbox(tmp_path, monkeypatch, capsys):
    import tools.classroom.grade as grade
    monkeypatch.setattr(grade, "why_not", lambda: "simulated: not root")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.ipynb").write_text(json.dumps({"cells": []}))
    assert main(["grade", str(tmp_path / "in"), str(tmp_path / "book")]) == 2
    err = capsys.readouterr().err
    assert "simulated: not root" in err and "--trusted" in err
    assert not (tmp_path / "book").exists()   # nothing graded, no gradebook


def test_why_not_names_the_missing_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "not running as root" in sandbox.why_not()
