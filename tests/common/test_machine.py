"""course_lib.common.machine: the cores a process may keep busy (affinity mask and cgroup quota),
read from fake cgroup trees; and ``common`` imports nothing from the folders above it."""
import ast
from pathlib import Path

import pytest

from course_lib.common import machine

COMMON = Path(__file__).resolve().parents[2] / "course_lib" / "common"


def test_common_imports_nothing_from_the_chapter_folders_above_it():
    folders = {p.name for p in COMMON.parent.iterdir() if p.is_dir()} - {"common"}
    found = [f"{path.name}: {node.module}" for path in COMMON.glob("*.py")
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and node.module
             and node.module.split(".")[:2][-1] in folders]
    assert found == []  # the launcher included: the machine probe lives here


@pytest.mark.parametrize("files, quota", [
    ({"cpu.max": "200000 100000\n"}, 2.0),                                  # cgroup v2, 2 CPUs
    ({"cpu.max": "max 100000\n"}, None),                                    # v2, unlimited
    ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.5),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),     # v1, none
    ({}, None),                                                             # no cgroup files
])
def test_cgroup_cpu_quota_is_read_from_v1_and_v2_files(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert machine.cgroup_cpu_quota(str(tmp_path)) == quota


def _cgroup_tree(tmp_path, files: dict, own: str) -> tuple[str, str]:
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    (tmp_path / "self_cgroup").write_text(own)
    return str(tmp_path / "fs"), str(tmp_path / "self_cgroup")


@pytest.mark.parametrize("files, own, cores", [
    ({"cpu.max": "150000 100000\n"}, "0::/\n", 1),                      # 1.5 CPUs: one core busy
    ({"pod/cpu.max": "100000 100000\n", "cpu.max": "max 100000\n"}, "0::/pod\n", 1),  # own cgroup
    ({"pod/cpu.max": "max 100000\n", "cpu.max": "200000 100000\n"}, "0::/pod\n", 2),  # a parent's
    ({"cpu/job/cpu.cfs_quota_us": "100000\n", "cpu/job/cpu.cfs_period_us": "100000\n"},
     "4:memory:/x\n1:cpu:/job\n0::/\n", 1),                               # v1, own cgroup
    ({"cpu,cpuacct/cpu.cfs_quota_us": "250000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
     "2:cpu,cpuacct:/\n", 2),                                            # v1, joint mount
    ({"cpu.max": "50000 100000\n"}, "0::/\n", 1),                       # half a CPU: still 1
    ({"cpu.max": "max 100000\n"}, "0::/\n", 64),                        # no quota: the mask
])
def test_usable_cores_reads_the_quota_of_the_process_own_cgroup(monkeypatch, tmp_path, files,
                                                               own, cores):
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert machine.usable_cores(*_cgroup_tree(tmp_path, files, own)) == cores


def test_usable_cores_is_capped_by_the_affinity_mask(monkeypatch, tmp_path):
    """taskset -c 0 under a 4-CPU quota: one core."""
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0})
    assert machine.usable_cores(*_cgroup_tree(tmp_path, {"cpu.max": "400000 100000\n"},
                                              "0::/\n")) == 1
