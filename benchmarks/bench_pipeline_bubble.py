"""Measured pipeline bubble vs (p-1)/(m+p-1), repeated: how close, and how much CPU the ranks had.

    PYTHONPATH=. python benchmarks/bench_pipeline_bubble.py [launches]

Each launch records 7 steps of the default GPipe pipeline (p=2, m=4) and reports the median step's
bubble. On an idle machine with a core per rank it lands within ~25 % of 0.2; when the ranks share
cores with other work it rises (the "cpu share" column says how starved they were). A timing
comparison, so it lives here and not in the unit tests.
"""
import sys
import time

from course_lib.pipeline_parallel.measure import bubble_formula, measure_pipeline


def main(launches: int = 10) -> None:
    formula = bubble_formula(2, 4)
    print(f"formula (p-1)/(m+p-1) = {formula:.3f}")
    print(f"{'launch':>6} {'bubble':>7} {'vs formula':>10} {'cpu share':>9} {'seconds':>8}")
    within = 0
    for i in range(launches):
        t0 = time.perf_counter()
        report = measure_pipeline()
        off = report.bubble / formula - 1
        within += abs(off) <= 0.25
        print(f"{i:6d} {report.bubble:7.3f} {off:+10.0%} {report.cpu_share:9.0%} "
              f"{time.perf_counter() - t0:8.1f}")
    print(f"{within}/{launches} launches within 25 % of the formula")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
