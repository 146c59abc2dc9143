"""course_lib.launcher.devices.plan: backend and device choice, and its error messages."""
import pytest

from course_lib import devices
from course_lib.common import machine


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


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 8])
def test_threads_fit_a_container_quota_smaller_than_the_affinity_mask(monkeypatch, nprocs):
    """A pod limited to 2.5 CPUs on a 64-core host: ranks x threads stay within 2 cores."""
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(machine, "cgroup_cpu_quota", lambda *paths: 2.5)
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    assert devices.cpu_count() == 2
    p = devices.plan(nprocs)
    assert p.threads == max(1, 2 // nprocs)
    assert nprocs * p.threads <= max(2, nprocs)  # one thread per rank once ranks outnumber cores
