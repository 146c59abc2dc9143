"""How fast the planner answers (issue 58: one 8B configuration <= 10 s, one table <= 60 s).

    python benchmarks/bench_planner.py [--repeats 3] [--tables] [--json OUT]

1. One configuration: Llama 3.1 8B, FSDP 8, selective checkpointing, batch 16 × 8192 on 8 H100
   96 GB (torchtitan's run), ``--repeats`` times: min and median seconds, wall and CPU.
2. ``--tables``: the whole table of Llama 3.1 70B on 64 H100 80 GB (global batch 64 × 8192) and
   of Mixtral 8x7B on 16 H100 80 GB (global batch 16 × 8192), each once, printed with its
   seconds: every row measured on fake tensors from the stored configs (layouts sharing a
   block shape share its fake runs: ``runs`` counts the fake steps actually run).
3. ``--full-build``: Llama 3.1 70B, FSDP 64 with full activation checkpointing (global batch 64
   × 8192): the planner's stage (3 and 4 blocks, scaled) against one fake step of all 80 blocks.
Each figure is printed with the load average: other work on 2 cores inflates every figure. The
CPU seconds are this process's plus its forked workers' (user + system): what the planner needed.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

from course_lib.plan.layouts import Candidate
from course_lib.plan.planner import clear_cache, measure_layout, plan


def _cpu() -> float:
    r, w = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + w.ru_utime + w.ru_stime


def timed(fn):
    wall, cpu = time.perf_counter(), _cpu()
    out = fn()
    return out, time.perf_counter() - wall, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tables", action="store_true")
    parser.add_argument("--full-build", action="store_true")
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
    if args.full_build:
        from course_lib.plan.models import load_config, model_spec
        config = load_config("llama-3.1-70b")
        spec, c = model_spec(config), Candidate(dp_shard=64, ac="full")
        clear_cache()
        (scaled, _, _), wall_s, _ = timed(lambda: measure_layout(config, c, spec, 64, 8192))
        (full, _, _), wall_f, _ = timed(lambda: measure_layout(config, c, spec, 64, 8192, depth=80))
        print(f"70B FSDP 64 AC full: scaled {scaled.peak:,} B ({wall_s:.1f} s), full build of 80 "
              f"blocks {full.peak:,} B ({wall_f:.1f} s): {scaled.peak / full.peak - 1:+.4%}")
        results["full_build"] = {"scaled": scaled.peak, "full": full.peak, "wall_full": wall_f}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
