"""Which hardware a run uses: CPU cores, GPUs, the backend, threads per rank.

Every launcher asks :func:`place` first, so bad requests fail here, with a clear message, before a
single process starts. The rules (chapter 00 explains them):

* no GPU (or ``device="cpu"``): gloo, CPU tensors, ``cores // nprocs`` threads per rank;
* at least ``nprocs`` GPUs: NCCL, one GPU per rank (``cuda:rank``);
* fewer GPUs than ranks: CPU + gloo by default (the course still runs); ``device="cuda"`` then
  puts several ranks on the same GPU(s) round-robin with gloo, which supports CUDA tensors
  (NCCL refuses two ranks on one GPU). With exactly one GPU, ``nprocs=1`` gives a one-rank NCCL
  run whose CUDA memory statistics are real.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

from course_lib.common import machine
from course_lib.common.checks import is_int
from course_lib.common.deprecation import renamed
from course_lib.common.machine import usable_cores  # noqa: F401 (its home is common.machine)

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
DEVICE_CHOICES = ("auto", *DEVICES)  # the launchers' and ``--device``'s vocabulary


def pin_cores(rank: int, threads: int) -> list[int]:
    """Restrict this process to cores ``rank·threads … rank·threads + threads - 1`` of the ones it
    may use (its threads created from now on inherit the mask); returns them."""
    cores = sorted(os.sched_getaffinity(0))[rank * threads:(rank + 1) * threads]
    os.sched_setaffinity(0, cores)
    return cores


def cpu_count() -> int:
    """Cores this process may use: :func:`~course_lib.common.machine.usable_cores` (affinity mask
    and cgroup quota)."""
    return machine.usable_cores()


def gpu_count() -> int:
    """Number of CUDA GPUs visible to this process (0 without CUDA)."""
    import torch  # here, not at the top: ``warm_up`` can start the server before torch loads

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def max_ranks() -> int:
    """The largest world size the course allows on this machine.

    8 ranks are always allowed (the course's "8 GPUs" examples run oversubscribed on 2 cores);
    bigger machines may use up to 2 ranks per core.
    """
    return max(8, 2 * cpu_count())


#: The longest ``timeout`` a launcher accepts (a week): a lesson needs seconds, and far beyond
#: (past ~8.6e13 s) the ranks' own ``timedelta`` overflows inside every rank.
MAX_TIMEOUT_S = 7 * 24 * 3600


def validate_timeout(timeout: object) -> float:
    """``timeout`` in seconds if positive, finite and at most :data:`MAX_TIMEOUT_S`, else ValueError."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, finite, got {timeout!r}")
    if timeout > MAX_TIMEOUT_S:
        raise ValueError(f"timeout must be at most {MAX_TIMEOUT_S} s (a week), got {timeout!r}")
    return float(timeout)


def loopback_interface() -> str:
    """Name of the loopback network interface: "lo" on Linux (the kernel names it), "lo0" on
    macOS and the BSDs."""
    return "lo" if sys.platform.startswith("linux") else "lo0"


@dataclass(frozen=True)
class Placement:
    """Where ranks run: backend, device type, device of each rank, threads per rank."""

    nprocs: int
    backend: str
    device: str
    threads: int

    def device_of(self, rank: int) -> torch.device:
        """The torch device rank ``rank`` computes on."""
        import torch

        if self.device == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", rank % gpu_count())


class DeviceError(ValueError, RuntimeError):
    """A request for a device or backend this machine cannot give (a ``ValueError``; also a
    ``RuntimeError``, the type CUDA-without-a-GPU had before issue 51)."""


def pipeline_device(device: str | None = None, backend: str | None = None) -> str:
    """The one rule for pipelines: ``"cpu"`` (chapter 09's stages send CPU tensors); a GPU
    request is a :class:`DeviceError`."""
    if device == "cuda" or backend == "nccl":
        raise DeviceError("pipeline layouts run on the CPU here (chapter 09's stages send CPU "
                          "tensors); use device='cpu'")
    return "cpu"


def place(nprocs: int, backend: str | None = None, device: str | None = None,
          threads: int | None = None, *, pipeline: bool = False,
          gpus: int | None = None) -> Placement:
    """Validate a launch request and decide backend, device and threads per rank.

    ``device``: ``None`` or ``"auto"`` (choose), ``"cpu"``, ``"cuda"``; ``backend``: ``None``
    (choose), ``"gloo"``, ``"nccl"``. A ``pipeline`` layout runs on the CPU (chapter 09's stages
    send CPU tensors). ``gpus``: the GPUs to plan for (default: those torch sees). A request
    this machine cannot give raises :class:`DeviceError` saying what to change; a wrong type,
    ``TypeError``. Nothing is started here.
    """
    if not is_int(nprocs):
        raise TypeError(f"nprocs must be an int, got {type(nprocs).__name__}")
    if nprocs < 1:
        raise DeviceError(f"nprocs must be at least 1, got {nprocs}")
    if nprocs > max_ranks():
        raise DeviceError(f"nprocs={nprocs} is more than this machine allows ({max_ranks()} "
                          f"ranks on {cpu_count()} cores); every rank is a real process")
    if backend is not None and backend not in BACKENDS:
        raise DeviceError(f"unknown backend {backend!r}; choose one of {BACKENDS} or None (auto)")
    if device is not None and device not in DEVICE_CHOICES:
        raise DeviceError(f"unknown device {device!r}; choose one of {DEVICE_CHOICES} or None")
    device = None if device == "auto" else device
    if pipeline:
        pipeline_device(device, backend)
    gpus = gpu_count() if gpus is None else gpus
    if (device == "cuda" or backend == "nccl") and gpus == 0:
        raise DeviceError(f"{'device=cuda' if device == 'cuda' else 'backend=nccl'} was "
                          "requested but this machine has no CUDA GPU; use the default (gloo "
                          "on CPU)")
    if backend == "nccl" and device == "cpu":
        raise DeviceError("NCCL only moves CUDA tensors; use backend='gloo' for device='cpu'")
    if backend == "nccl" and nprocs > gpus:
        raise DeviceError(f"NCCL needs one GPU per rank: {nprocs} ranks but {gpus} GPU(s); "
                          "use fewer ranks, or backend='gloo' (ranks then share GPUs)")
    if device is None:
        device = "cuda" if not pipeline and (
            backend == "nccl" or (backend is None and 0 < nprocs <= gpus)) else "cpu"
    if backend is None:
        backend = "nccl" if device == "cuda" and nprocs <= gpus else "gloo"
    if threads is None:
        threads = max(1, cpu_count() // nprocs)
    elif isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int or None, got {threads!r}")
    elif threads < 1:
        raise DeviceError(f"threads must be at least 1, got {threads}")
    elif threads > cpu_count():
        raise DeviceError(f"threads must be at most {cpu_count()}, the cores this process may "
                          f"use, got {threads}: more threads per rank than cores only take turns")
    return Placement(nprocs=nprocs, backend=backend, device=device, threads=threads)


# names before issue 51: ``plan`` (now ``place``; the fine-tuning planner is ``plan_finetuning``)
__getattr__ = renamed(__name__, {"plan": "place", "check_timeout": "validate_timeout"})


def describe() -> dict:
    """Facts for the environment check in chapter 00: cores, memory, GPUs, torch, backend."""
    import psutil
    import torch
    import torch.distributed

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu_cores": cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpu_count(),
        "gloo": torch.distributed.is_gloo_available(),
        "nccl": torch.distributed.is_nccl_available() and gpu_count() > 0,
        "default_backend_4_ranks": place(4).backend,
    }
    if info["gpus"]:
        info["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(info["gpus"])]
    return info
