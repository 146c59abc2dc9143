"""How long each chapter's widget takes to answer its default, as the notebook calls it.

    python benchmarks/bench_widgets.py            # every widget, twice each
    python benchmarks/bench_widgets.py planner    # one by name

A widget's default must answer in seconds on a 2-core laptop (the README's promise to a class). Each widget is
built and its first answer computed exactly as its notebook cell does it (in the same order, so
the warm server is already up, as it is in a notebook). Chapters whose widget reuses what the
cell above measured (07's planner, 08's DeepSpeed table) are timed with that cell's run outside
the figure, and the cost of a *new* setting is printed next to it. Prints seconds and the load.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable


def _timed(fn: Callable[[], object], repeats: int = 2) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def _cases() -> dict[str, Callable[[], list[float]]]:
    def memory():
        from course_lib.memory.show import memory_widget
        return _timed(memory_widget)

    def dp():
        from course_lib.data_parallel.show import dp_widget
        return _timed(dp_widget)

    def sharding():
        from course_lib.sharding.show import sharding_widget
        return _timed(sharding_widget)

    def pipeline():
        from course_lib.pipeline_parallel.show import pipeline_widget
        from course_lib.tensor_parallel.show import tp_widget
        return _timed(pipeline_widget) + _timed(tp_widget)

    def whatif():
        from course_lib.communication.show import whatif_widget
        return _timed(whatif_widget)

    def interval():
        from course_lib.fault_tolerance.show import interval_widget
        return _timed(interval_widget)

    def planner():
        from course_lib.finetuning.planner import plan_finetuning
        from course_lib.finetuning.show import planner_widget
        cache: dict = {}
        plan_finetuning("gpt-7b", gpu_memory_gb=80, n_gpus=8, seq_len=2048, cache=cache)  # the cell above
        default = _timed(lambda: planner_widget(model="gpt-7b", gpu_memory_gb=80, n_gpus=8,
                                                seq_len=2048, cache=cache))
        memory_only = _timed(lambda: plan_finetuning("gpt-7b", gpu_memory_gb=40, n_gpus=8, seq_len=2048,
                                          cache=cache), 1)
        new_gpus = _timed(lambda: plan_finetuning("gpt-7b", gpu_memory_gb=80, n_gpus=4, seq_len=2048,
                                       cache=cache), 1)
        print(f"    planner: new GPU memory {memory_only[0]:.2f} s, new GPU count (fake runs) "
              f"{new_gpus[0]:.1f} s")
        return default

    def deepspeed():
        from course_lib.deepspeed.show import deepspeed_widget
        from course_lib.deepspeed.engine import run_zero_stages
        result = run_zero_stages(nprocs=2, steps=3)  # the cell above
        return _timed(lambda: deepspeed_widget(result))

    return {"memory": memory, "dp": dp, "sharding": sharding, "pipeline": pipeline,
            "whatif": whatif, "interval": interval, "planner": planner, "deepspeed": deepspeed}


def main(names: list[str]) -> None:
    from course_lib import warm_up
    warm_up()
    cases = _cases()
    for name in names or list(cases):
        seconds = cases[name]()
        load = os.getloadavg()[0]
        print(f"{name:<10} default answered in " + ", ".join(f"{s:.2f}" for s in seconds)
              + f" s (load {load:.1f})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
