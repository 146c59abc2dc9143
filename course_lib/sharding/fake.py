"""Simulate one rank of a big distributed run in this process: fake tensors, fake process group.

Chapter 3 asks which strategy lets a 7B model train on 8 × 80 GB GPUs. A rank's *memory* depends
only on shapes and dtypes, so :func:`measure_fake` runs the very code of a real rank
(:func:`course_lib.sharding.rank_measure.measure_rank`: same wrapping, same trackers) with a
**fake process group** (``torch.testing._internal.distributed.fake_pg``, backend ``"fake"``:
``world_size`` ranks declared, this process plays rank ``r``, collectives return at once) and
**FakeTensorMode** (the model is built on fake tensors, nothing is allocated, every operator
only computes shapes; the trackers still see every "allocation"). Traps: the device mesh is
created *outside* FakeTensorMode (inside, its creation fails) and optimizers use
``foreach=False`` (foreach kernels report a bogus optimizer peak on fake tensors). Step times are
not measured (fake operators take no real time).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from course_lib.common.checks import is_int
from course_lib.common.models import GPTConfig, get_config
from course_lib.memory.report import MemoryReport
from course_lib.sharding.rank_measure import measure_rank
from course_lib.sharding.strategies import FSDP_ONLY

__all__ = ["measure_fake", "fake_process_group"]


@contextlib.contextmanager
def fake_process_group(rank: int, world: int) -> Iterator[None]:
    """A fake default process group where this process is ``rank`` of ``world``, while inside."""
    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process; fake runs need "
                           "their own (call them outside course_lib.run ranks)")
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def measure_fake(config: GPTConfig | str, batch: tuple[int, int], *, nprocs: int,
                 strategy: str = "ddp", optimizer: str = "adam", precision: str = "fp32",
                 iterations: int = 2, seed: int = 0,
                 ranks: Sequence[int] | None = None, recompute: str = "none") -> list[MemoryReport]:
    """One fake run per rank in ``ranks`` (default: every rank); reports in that order.

    Only a config (or preset name) with ``batch = (batch_size, seq_len)``: a built module would
    already hold real memory. Use ``ranks=[0]`` for a quick look at a big world size.
    """
    if not isinstance(config, (GPTConfig, str)):
        raise ValueError("fake=True needs a GPTConfig or preset name and batch=(batch_size, "
                         "seq_len), not a module: a built module has already allocated its memory")
    config = get_config(config)
    ranks = list(range(nprocs)) if ranks is None else list(ranks)
    bad = [r for r in ranks if not is_int(r) or not 0 <= r < nprocs]
    if bad or not ranks:
        raise ValueError(f"ranks must be a non-empty list of ranks in [0, {nprocs}), got {ranks!r}")
    reports = []
    for rank in ranks:
        with fake_process_group(rank, nprocs):
            mesh = init_device_mesh("cpu", (nprocs,)) if strategy in FSDP_ONLY else None
            with FakeTensorMode():
                reports.append(measure_rank(config, batch, strategy=strategy, optimizer=optimizer,
                                            precision=precision, iterations=iterations, seed=seed,
                                            mesh=mesh, fake=True, recompute=recompute))
    return reports
