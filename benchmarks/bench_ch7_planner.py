"""Chapter 7: the planner's depth probes vs full-depth fake runs, and how long each takes.

    python benchmarks/bench_ch7_planner.py [preset] [method ...]

Prints, per method, the probed (two small depths, extrapolated) and the full-depth per-GPU bytes and
the seconds each took. Default: gpt-7b on 8 × 80 GB, seq 2048, every method (several minutes).
"""
from __future__ import annotations

import sys
import time

from course_lib.common.models import get_config
from course_lib.finetuning.planner import (ADAPTER_METHODS, FULL_STRATEGIES, measure_method,
                                          plan_finetuning)


def main(preset: str = "gpt-7b", methods: tuple[str, ...] = FULL_STRATEGIES + ADAPTER_METHODS) -> None:
    config = get_config(preset)
    for method in methods:
        gpus = 8 if method in FULL_STRATEGIES else 1
        start = time.perf_counter()
        probed = plan_finetuning(config, n_gpus=8, seq_len=config.seq_len, depth="probe",
                      methods=(method,)).row(method).bytes
        t_probe = time.perf_counter() - start
        start = time.perf_counter()
        full = measure_method(config, method, gpus, (1, config.seq_len))
        t_full = time.perf_counter() - start
        print(f"{method:<6} probe {t_probe:5.1f} s  full {t_full:5.1f} s")
        for key in full:
            print(f"    {key:<12}{probed[key] / 1e9:>10.3f} GB probed {full[key] / 1e9:>10.3f} GB full "
                  f"({probed[key] / full[key] - 1:+.2%})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpt-7b", tuple(sys.argv[2:]) or FULL_STRATEGIES + ADAPTER_METHODS)
