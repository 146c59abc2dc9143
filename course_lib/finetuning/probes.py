"""The planner's fake-tensor runs: one method at one depth, and many of them on both cores.

A fake run (chapter 3's fake process group, chapter 7's fake LoRA path) is pure Python work on
one core: every operator only computes output shapes.
:func:`course_lib.finetuning.planner.plan_finetuning` needs a dozen of them for a 7B table (~1-2 s
each on a 2-core laptop), independent of each other, so :func:`measure_many` splits them over
``processes`` ranks of :func:`course_lib.run` (each rank drops its gloo group: a fake run brings
its own fake one). The numbers are the same as in one
process — fake runs are deterministic (``tests/finetuning/test_planner.py`` compares).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator, Sequence

from course_lib.common.models import GPTConfig
from course_lib.finetuning.footprint import measure_finetune
from course_lib.launcher.launch import run
from course_lib.sharding.measure import measure_distributed

__all__ = ["FULL_STRATEGIES", "ADAPTER_METHODS", "Probe", "measure_method", "measure_many"]

FULL_STRATEGIES = ("ddp", "zero1", "fsdp_no_reshard", "fsdp")
ADAPTER_METHODS = ("lora", "qlora")
#: One fake run: (config at the depth to measure, method, GPUs, (micro_batch, seq_len), LoRA r,
#: recompute) — also the key of the planner's cache.
Probe = tuple[GPTConfig, str, int, tuple[int, int], int, str]


def measure_method(config: GPTConfig, method: str, n_gpus: int, shape: tuple[int, int],
                   r: int = 16, recompute: str = "none") -> dict[str, int]:
    """Per-GPU bytes (``weights``, ``grads``, ``optimizer``, ``activations``, ``peak``) of one method,
    measured on fake tensors at the config's full depth (rank 0 for the distributed ones).
    ``recompute`` (full fine-tuning only): chapter 1's activation recomputation of the blocks."""
    if method in FULL_STRATEGIES:
        rep = measure_distributed(config, shape, strategy=method, nprocs=n_gpus, precision="amp",
                                  fake=True, ranks=[0], recompute=recompute)[0]
    else:
        rep = measure_finetune(config, shape, method, r=r, fake=True)
    b = rep.bytes
    return {"weights": b["params"] + b["buffers"], "grads": b["grads"], "optimizer": b["optimizer"],
            "activations": b["activations"], "peak": b["peak"]}


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause automatic garbage collection (restored on exit, also after an error): fake runs
    create many short-lived objects and no cycles worth collecting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _cost(probe: Probe) -> float:
    """Rough relative time of a fake run (measured on 7B-wide probes: ~0.45 s per layer)."""
    config, method = probe[0], probe[1]
    return (config.n_layer + 1) * (1.5 if method in FULL_STRATEGIES else 1.0)


def _measure_share(shares: list[list[Probe]]) -> list[dict[str, int]]:
    """In a rank of :func:`course_lib.run`: this rank's probes, in order."""
    import torch.distributed as dist

    rank = dist.get_rank()
    dist.destroy_process_group()  # the fake runs make their own (fake) process group
    with _gc_paused():
        return [measure_method(*probe) for probe in shares[rank]]


def measure_many(probes: Sequence[Probe], processes: int = 1) -> dict[Probe, dict[str, int]]:
    """Measure every probe (duplicates once); with ``processes > 1``, spread over that many
    processes, longest first onto the least loaded one. Returns ``{probe: bytes}``."""
    todo = list(dict.fromkeys(probes))
    if processes < 2 or len(todo) < 2:
        with _gc_paused():
            return {probe: measure_method(*probe) for probe in todo}

    processes = min(processes, len(todo))
    shares: list[list[Probe]] = [[] for _ in range(processes)]
    load = [0.0] * processes
    for probe in sorted(todo, key=_cost, reverse=True):
        i = load.index(min(load))
        shares[i].append(probe)
        load[i] += _cost(probe)
    results = run(_measure_share, processes, shares, backend="gloo", device="cpu", threads=1,
                  timeout=600.0)
    return {probe: value for share, values in zip(shares, results)
            for probe, value in zip(share, values)}
