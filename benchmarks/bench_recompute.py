"""Chapter 1: memory and time of activation recomputation (none / selective / full), per preset.

    python benchmarks/bench_recompute.py [preset ...]

Prints, per preset and batch, measured activations and peak (torch's tracker) beside the
predictions of course_lib.memory.predict, and the median seconds of forward + backward without
the tracker; "extra fwd" is the added time in units of one forward (about 1 for full).
"""
from __future__ import annotations

import sys

from course_lib.memory.recompute import tradeoff
from course_lib.memory.report import format_bytes

SHAPES = {"tiny": [(8, 64)], "small": [(4, 128)], "medium": [(1, 256), (4, 256)]}


def main(presets: tuple[str, ...] = ("tiny", "small", "medium")) -> None:
    print(f"{'preset':<8}{'b x s':>9}{'mode':>11}{'activations':>13}{'pred.':>7}{'peak':>12}{'pred.':>7}"
          f"{'fwd ms':>8}{'step ms':>9}{'extra fwd':>10}")
    for preset in presets:
        for row in tradeoff(preset, SHAPES.get(preset, [(1, 64)]), repeats=5):
            print(f"{preset:<8}{row['batch']:>4} x{row['seq_len']:>4}{row['recompute']:>11}"
                  f"{format_bytes(row['activations']):>13}{row['activations'] / row['activations_predicted']:>7.3f}"
                  f"{format_bytes(row['peak']):>12}{row['peak'] / row['peak_predicted']:>7.3f}"
                  f"{row['forward_s'] * 1e3:>8.1f}{row['step_s'] * 1e3:>9.1f}{row['extra_forwards']:>10.2f}")


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or ("tiny", "small", "medium"))
