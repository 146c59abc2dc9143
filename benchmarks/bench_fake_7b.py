"""Measure the 7B GPT on 8 ranks with every strategy on fake tensors; store the reports (chapter 3).

    python benchmarks/bench_fake_7b.py                 # writes data/sharding_7b.json
    python benchmarks/bench_fake_7b.py --jobs 4 --world 8 --batch 1 --seq 2048

Each configuration is one fake run of rank 0 (:func:`course_lib.measure_distributed` with
``fake=True, ranks=[0]``): the trackers see every allocation of a real rank without allocating.
A fake 7B run takes ~0.5-2 CPU-minutes (every operator still goes through FakeTensorMode, DTensor
and the tracker in Python), too slow for the notebook, which loads this file instead
(:func:`course_lib.sharding.show.load_fake_7b`) and runs the same code live on a smaller model.
Prints the seconds each configuration took.
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "data" / "sharding_7b.json"


def one(job: tuple[str, str, int, int, int]) -> dict:
    strategy, precision, world, batch, seq = job
    from course_lib.sharding.measure import measure_distributed
    start = time.perf_counter()
    report = measure_distributed("gpt-7b", (batch, seq), strategy=strategy, nprocs=world,
                                 precision=precision, fake=True, ranks=[0])[0]
    seconds = time.perf_counter() - start
    print(f"{strategy:6s} {precision:5s} world={world}: {seconds:6.1f} s", flush=True)
    return {"strategy": strategy, "precision": precision, "world": world, "rank": 0,
            "batch": [batch, seq], "bytes": dict(report.bytes), "comm": report.info["comm"],
            "n_params_rank": report.n_params, "total_params": report.info["total_params"],
            "seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    jobs = [(s, p, args.world, args.batch, args.seq) for p in ("amp", "fp32")
            for s in ("fsdp", "fsdp_no_reshard", "zero1", "ddp")]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, jobs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"preset": "gpt-7b", "rows": rows}, indent=1) + "\n")
    print(f"wrote {len(rows)} configurations")


if __name__ == "__main__":
    main()
