"""How fast the planner answers (issue 58: one 8B configuration <= 10 s, one table <= 60 s).

    python benchmarks/bench_planner.py [--repeats 3] [--tables] [--json OUT]

1. One configuration: Llama 3.1 8B, FSDP 8, selective checkpointing, batch 16 × 8192 on 8 H100
   96 GB (torchtitan's run), ``--repeats`` times: min and median seconds, wall and CPU.
2. ``--tables``: the whole table of Llama 3.1 70B on 64 H100 80 GB (global batch 64 × 8192) and
   of Mixtral 8x7B on 16 H100 80 GB (global batch 16 × 8192), each once, printed with its
   seconds: every row measured on fake tensors from the stored configs (layouts sharing a
   block shape share its fake runs: ``runs`` counts the fake steps actually run).
Each figure is printed with the load average: other work on 2 cores inflates every figure, and
the CPU seconds of this process (user + system) say what the planner itself needed.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

from course_lib.plan.layouts import Candidate
from course_lib.plan.planner import clear_cache, plan


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn):
    wall, cpu = time.perf_counter(), _cpu()
    out = fn()
    return out, time.perf_counter() - wall, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tables", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {"date": time.strftime("%Y-%m-%d"), "load_before": os.getloadavg()[0]}
    one = lambda: plan("llama-3.1-8b", gpus=8, cluster="h100-96gb", global_batch=16,  # noqa: E731
                       seq_len=8192, layouts=[Candidate(dp_shard=8, ac="selective")])
    timed(one)  # the first call imports transformers and fills torch's caches
    walls, cpus = [], []
    for _ in range(args.repeats):
        clear_cache()  # each repeat measures its fake steps again
        p, wall, cpu = timed(one)
        walls.append(wall)
        cpus.append(cpu)
    print(p)
    print(f"one configuration (8B, FSDP 8, AC selective): wall min {min(walls):.2f} s, median "
          f"{statistics.median(walls):.2f} s; CPU min {min(cpus):.2f} s, median "
          f"{statistics.median(cpus):.2f} s; load {os.getloadavg()[0]:.1f}")
    results["one"] = {"wall": walls, "cpu": cpus}
    if args.tables:
        for name, kw in (("llama-3.1-70b", dict(gpus=64, global_batch=64)),
                         ("mixtral-8x7b-v0.1", dict(gpus=16, global_batch=16))):
            clear_cache()  # every block shape measured in this table, none borrowed
            p, wall, cpu = timed(lambda: plan(name, cluster="h100-80gb", seq_len=8192, **kw))
            print(p.__str__())
            print(f"table {name} on {kw['gpus']} GPUs: {len(p.rows)} layouts, {p.runs} fake steps, "
                  f"wall {wall:.1f} s, CPU {cpu:.1f} s; load {os.getloadavg()[0]:.1f}")
            results[name] = {"wall": wall, "cpu": cpu, "rows": len(p.rows), "runs": p.runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
