"""course_lib.launcher.devices.plan: backend and device choice, and its error messages."""
import pytest

from course_lib import devices


def test_cpu_only_machine_uses_gloo_on_cpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    p = devices.plan(4)
    assert (p.backend, p.device, p.nprocs) == ("gloo", "cpu", 4)
    assert p.threads == max(1, devices.cpu_count() // 4)


def test_enough_gpus_give_nccl_one_gpu_per_rank(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 4)
    p = devices.plan(4)
    assert (p.backend, p.device) == ("nccl", "cuda")
    assert [p.device_of(r).index for r in range(4)] == [0, 1, 2, 3]


def test_one_gpu_many_ranks_defaults_to_cpu_or_shares_the_gpu_with_gloo(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    assert devices.plan(1).backend == "nccl"  # a one-rank NCCL run with real CUDA memory stats
    assert (devices.plan(4).backend, devices.plan(4).device) == ("gloo", "cpu")
    shared = devices.plan(4, device="cuda")
    assert (shared.backend, shared.device) == ("gloo", "cuda")
    assert {shared.device_of(r).index for r in range(4)} == {0}
    with pytest.raises(ValueError, match="NCCL needs one GPU per rank: 4 ranks but 1 GPU"):
        devices.plan(4, backend="nccl")


def test_nccl_with_cpu_is_refused(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    with pytest.raises(ValueError, match="NCCL only moves CUDA tensors"):
        devices.plan(2, backend="nccl", device="cpu")


def test_describe_reports_the_environment():
    info = devices.describe()
    assert info["cpu_cores"] == devices.cpu_count() and info["gloo"] is True
    assert info["default_backend_4_ranks"] in ("gloo", "nccl")


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
    assert devices._cgroup_cpu_quota(str(tmp_path)) == quota


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 8])
def test_threads_fit_a_container_quota_smaller_than_the_affinity_mask(monkeypatch, nprocs):
    """A pod limited to 2.5 CPUs on a 64-core host: ranks x threads stay within 2 cores."""
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(devices, "_cgroup_cpu_quota", lambda *paths: 2.5)
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    assert devices.cpu_count() == 2
    p = devices.plan(nprocs)
    assert p.threads == max(1, 2 // nprocs)
    assert nprocs * p.threads <= max(2, nprocs)  # one thread per rank once ranks outnumber cores


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
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert devices.usable_cores(*_cgroup_tree(tmp_path, files, own)) == cores


def test_usable_cores_is_capped_by_the_affinity_mask(monkeypatch, tmp_path):
    """taskset -c 0 under a 4-CPU quota: one core."""
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0})
    assert devices.usable_cores(*_cgroup_tree(tmp_path, {"cpu.max": "400000 100000\n"},
                                              "0::/\n")) == 1
