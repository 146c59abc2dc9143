"""Chapter 00's whole game outside the notebook: the README's figure and the stored longer run.

    python benchmarks/whole_game.py figure     # docs/img/whole_game.png: chapter 00's two curves
    python benchmarks/whole_game.py long-run [--threads N]  # data/whole_game_long_run.json

``figure`` calls what chapter 00's cells call (``train_gpt_ddp`` in this process and on two
ranks with ``course_lib.run``, then ``plot_whole_game``), with the notebook's settings.
``long-run`` trains the same function 7.5 times longer, in one process, and stores the
losses every 50 steps, samples before and after (the notebook's seeds and length), the settings,
the date and the machine: the notebook shows it, labelled, beside its live short run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from course_lib.capstone.sample import generate, model_from  # noqa: E402
from course_lib.capstone.whole_game import LIVE, train_gpt_ddp  # noqa: E402
from course_lib.common.models import get_config  # noqa: E402

LONG = {"steps": 1500, "global_batch": 16, "lr": 3e-3, "seed": 0, "preset": "tiny"}
SAMPLE = {"n_bytes": 300, "seed": 0}


def figure(path: Path = ROOT / "docs" / "img" / "whole_game.png") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    from course_lib import run
    from course_lib.capstone.show import plot_whole_game

    torch.set_num_threads(1)  # as each rank
    one = train_gpt_ddp(**LIVE)
    two = run(train_gpt_ddp, 2, threads=1, **LIVE)[0]
    fig = plot_whole_game(one, two)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"wrote {path}")
    return path


def long_run(path: Path = ROOT / "data" / "whole_game_long_run.json", threads: int = 1) -> Path:
    torch.set_num_threads(threads)
    config = get_config(LONG["preset"])
    t0 = time.perf_counter()
    result = train_gpt_ddp(**LONG)
    seconds = time.perf_counter() - t0
    record = {
        "what": "chapter 00's train_gpt_ddp run longer, in one process (benchmarks/whole_game.py "
                "long-run)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, {platform.system()}, "
                   f"{threads} torch thread(s), torch {torch.__version__}",
        "settings": LONG, "sample": SAMPLE, "seconds": round(seconds, 1),
        "losses_every_50": [round(x, 4) for x in result["losses"][::50]] + [
            round(result["losses"][-1], 4)],
        "before": generate(model_from(config), **SAMPLE),
        "after": generate(model_from(config, result["params"]), **SAMPLE),
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path} ({seconds:.0f} s)")
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["figure", "long-run"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the long run")
    args = parser.parse_args()
    figure() if args.what == "figure" else long_run(threads=args.threads)
