"""course_lib.launcher.devices.place: backend and device choice, and its error messages."""
import warnings

import pytest

from course_lib import devices
from course_lib.common import machine


def test_cpu_only_machine_uses_gloo_on_cpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    p = devices.place(4)
    assert (p.backend, p.device, p.nprocs) == ("gloo", "cpu", 4)
    assert p.threads == max(1, devices.cpu_count() // 4)


def test_enough_gpus_give_nccl_one_gpu_per_rank(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 4)
    p = devices.place(4)
    assert (p.backend, p.device) == ("nccl", "cuda")
    assert [p.device_of(r).index for r in range(4)] == [0, 1, 2, 3]


def test_one_gpu_many_ranks_defaults_to_cpu_or_shares_the_gpu_with_gloo(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    assert devices.place(1).backend == "nccl"  # a one-rank NCCL run with real CUDA memory stats
    assert (devices.place(4).backend, devices.place(4).device) == ("gloo", "cpu")
    shared = devices.place(4, device="cuda")
    assert (shared.backend, shared.device) == ("gloo", "cuda")
    assert {shared.device_of(r).index for r in range(4)} == {0}
    with pytest.raises(ValueError, match="NCCL needs one GPU per rank: 4 ranks but 1 GPU"):
        devices.place(4, backend="nccl")


def test_nccl_with_cpu_is_refused(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    with pytest.raises(ValueError, match="NCCL only moves CUDA tensors"):
        devices.place(2, backend="nccl", device="cpu")


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
    p = devices.place(nprocs)
    assert p.threads == max(1, 2 // nprocs)
    assert nprocs * p.threads <= max(2, nprocs)  # one thread per rank once ranks outnumber cores


def test_every_refusal_is_one_type_that_old_except_clauses_still_catch(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    for request in [dict(device="cuda"), dict(backend="nccl"), dict(device="gpu"),
                    dict(threads=10**9), dict(nprocs=0)]:
        with pytest.raises(devices.DeviceError) as caught:
            devices.place(**{"nprocs": 2, **request})
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, RuntimeError)


@pytest.mark.parametrize("gpus, request_, chosen", [
    (1, dict(device="auto"), ("cuda", "nccl")), (0, dict(device="auto"), ("cpu", "gloo")),
    (1, dict(device="cpu"), ("cpu", "gloo")), (1, dict(device="cuda"), ("cuda", "nccl")),
    (1, dict(device="auto", pipeline=True), ("cpu", "gloo")),
    (1, dict(device=None, pipeline=True), ("cpu", "gloo")),
])
def test_one_vocabulary_for_run_and_the_capstone_script(gpus, request_, chosen):
    p = devices.place(1, gpus=gpus, **request_)
    assert (p.device, p.backend) == chosen


def test_a_pipeline_on_cuda_is_refused_before_any_process(monkeypatch):
    with pytest.raises(devices.DeviceError, match="pipeline layouts run on the CPU"):
        devices.place(2, device="cuda", pipeline=True, gpus=2)
    with pytest.raises(devices.DeviceError, match="pipeline layouts run on the CPU"):
        devices.place(2, backend="nccl", pipeline=True, gpus=2)


@pytest.mark.parametrize("old, new", [("plan", "place"), ("check_timeout", "validate_timeout")])
def test_the_old_names_still_work_and_warn_with_the_new_one(old, new):
    with pytest.warns(DeprecationWarning, match=rf"devices\.{old} is deprecated: use .*{new}"):
        assert getattr(devices, old) is getattr(devices, new)
    assert old not in devices.__all__ if hasattr(devices, "__all__") else True


def test_pick_device_is_a_deprecated_call_of_place(monkeypatch):
    from course_lib.capstone import train
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.warns(DeprecationWarning, match="pick_device is deprecated: use .*devices.place"):
        assert train.pick_device("auto", cuda_available=True) == ("cuda", "nccl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert train.pick_device("auto", cuda_available=False) == ("cpu", "gloo")
        with pytest.raises(ValueError, match="pipeline layouts run on the CPU"):
            train.pick_device("cuda", cuda_available=True, pipeline=True)
        with pytest.raises(ValueError, match="unknown device 'gpu'"):
            train.pick_device("gpu")
