"""Record chapter 05's link sweep to ``data/link_sweep.json`` (shown where namespaces are refused).

Run as root, or where ``unshare --user --map-root-user --net`` works, from the repository root::

    python benchmarks/record_link_sweep.py --out data/link_sweep.json
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from course_lib.common.recorded import machine_meta
from course_lib.communication.link_sweep import (LinkRow, LinkSweepUnavailable, availability,
                                                 link_sweep)
from course_lib.communication.link_sweep_record import RECORD_RATES, RECORDED_PATH


def record(path: str | Path = RECORDED_PATH, rates: Sequence[float] = RECORD_RATES,
           latency_ms: float = 0.0, steps: int = 3) -> list[LinkRow]:
    """Run the sweep here and write it with this machine's facts to ``path`` (JSON)."""
    rows = link_sweep(rates, latency_ms=latency_ms, steps=steps)
    meta = {**machine_meta("python benchmarks/record_link_sweep.py --out "
                           f"data/link_sweep.json --rates {' '.join(f'{r:g}' for r in rates)} "
                           f"--steps {steps}"), "mode": availability()[0]}
    Path(path).write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Record the chapter-5 link sweep to JSON.")
    parser.add_argument("--out", default=str(RECORDED_PATH))
    parser.add_argument("--rates", nargs="+", type=float, default=list(RECORD_RATES))
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        rows = record(args.out, args.rates, args.latency_ms, args.steps)
    except LinkSweepUnavailable as exc:
        print(f"skipped: {exc.reason}")
        sys.exit(2)
    for row in rows:
        print(f"{row.link:>22} {row.strategy:>5} step {row.step_s * 1e3:7.1f} ms  predicted "
              f"{row.predicted_s * 1e3:7.1f} ms  sent {row.sent_bytes / 1e6:6.2f} MB")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
