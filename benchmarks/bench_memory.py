"""Chapter 1 benchmark: how long memory measurements take, and how much memory they use.

    python benchmarks/bench_memory.py

Prints the time and peak RSS of the fake-tensor estimate of the ``gpt-7b`` preset (targets:
≤ 30 s, ≤ 1 GiB) and the latency of the widget's default configuration (target: < 3 s), plus the
measured-vs-predicted figures of every preset. Times depend on the machine and its load.
"""
from __future__ import annotations

import resource
import statistics
import time

from course_lib.memory import predict
from course_lib.memory.tracker import measure_step
from course_lib.memory.report import format_bytes
from course_lib.memory.show import memory_explorer

KEYS = ("params", "grads", "optimizer", "activations", "peak")
BATCHES = {"tiny": (8, 64), "small": (4, 128), "medium": (2, 256), "gpt-7b": (1, 2048)}


def rss_gib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def compare(name: str, fake: bool) -> None:
    report = measure_step(name, BATCHES[name], fake=fake)
    predicted = predict.predict_step(name, *BATCHES[name])
    cells = "  ".join(f"{k} {format_bytes(report[k])} / {format_bytes(predicted[k])}" for k in KEYS)
    print(f"{name:<7} {'fake' if fake else 'real'} b,s={BATCHES[name]}: {cells}")


def main() -> None:
    memory_explorer()  # warm-up: first calls pay for lazy initialisation in torch
    latencies = []
    for _ in range(5):
        t0 = time.perf_counter()
        memory_explorer()
        latencies.append(time.perf_counter() - t0)
    print(f"widget default (tiny, batch 8 x 64, fp32, adam): median {statistics.median(latencies):.2f} s, "
          f"max {max(latencies):.2f} s over 5 runs (target < 3 s)")

    rss_before = rss_gib()
    t0 = time.perf_counter()
    big = measure_step("gpt-7b", BATCHES["gpt-7b"], fake=True)
    seconds = time.perf_counter() - t0
    print(f"gpt-7b fake estimate: {seconds:.1f} s, peak RSS {rss_gib():.2f} GiB "
          f"(before: {rss_before:.2f} GiB; targets <= 30 s, <= 1 GiB); "
          f"model states {big['model_states'] / 1e9:.1f} GB = {big['model_states'] / 2**30:.1f} GiB")

    print("measured / predicted:")
    for name in ("tiny", "small", "medium"):
        compare(name, fake=False)
    compare("gpt-7b", fake=True)


if __name__ == "__main__":
    main()
