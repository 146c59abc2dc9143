"""Chapter 12's stored longer run: the capstone's loop trained long enough to write words.

    python benchmarks/capstone_long_run.py [--steps 4000] [--chunk 250] [--ckpt DIR]

Trains the course GPT (``small`` preset: 4 layers, 128 channels, 128 bytes of context) in one
process with the capstone's own loop, :func:`course_lib.capstone.train.train_rank_capstone`,
in chunks: each chunk resumes from the newest checkpoint (DCP, the same protocol the chapter's
restart uses, bit for bit an uninterrupted run) and, when it ends, rewrites
``data/capstone_long_run.json`` with the settings, date, machine, the losses every 50 steps, the
validation losses and a sample from the weights so far. Stopped early, the file holds the last
finished chunk, labelled with the steps it reached.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from course_lib.capstone.sample import generate, model_from, word_overlap  # noqa: E402
from course_lib.capstone.train import train_rank_capstone  # noqa: E402
from course_lib.common.models import get_config  # noqa: E402
from course_lib.composition.layout import Layout  # noqa: E402

PATH = ROOT / "data" / "capstone_long_run.json"
SETTINGS = {"preset": "small", "batch_size": 16, "lr": 3e-3, "seed": 0, "eval_every": 250}
SAMPLE = {"n_bytes": 400, "seed": 0}


def _done(path: Path) -> int:
    """The steps the record at ``path`` reached (0: none)."""
    return json.loads(path.read_text())["settings"]["steps"] if path.is_file() else 0


def long_run(steps: int, chunk: int, ckpt: str, path: Path = PATH) -> None:
    torch.set_num_threads(1)
    config = get_config(SETTINGS["preset"])
    kwargs = {k: v for k, v in SETTINGS.items() if k != "preset"}
    seconds = 0.0
    if path.is_file():  # a run resumed in another process: its seconds so far carry over
        before = json.loads(path.read_text())
        if {**before["settings"], "steps": 0} == {**SETTINGS, "steps": 0}:
            seconds = before["seconds"]
    for target in range(chunk, steps + 1, chunk):
        if target <= _done(path):
            continue  # this chunk's checkpoint exists: the next call resumes after it
        t0 = time.perf_counter()
        out = train_rank_capstone(config, Layout(), target, ckpt_dir=ckpt, every=chunk,
                                  keep=1, **kwargs)
        seconds += time.perf_counter() - t0
        losses = out["losses"]
        after = generate(model_from(config, out["params"]), **SAMPLE)
        record = {
            "what": "the capstone's loop (train_rank_capstone) in one process, resumed from its "
                    "own checkpoint every chunk (benchmarks/capstone_long_run.py)",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, "
                       f"{platform.system()}, 1 torch thread, torch {torch.__version__}",
            "settings": {**SETTINGS, "steps": target}, "sample": SAMPLE,
            "seconds": round(seconds, 1),
            "losses_every_50": [round(x, 4) for x in losses[::50]] + [round(losses[-1], 4)],
            "val_losses": [[s, round(v, 4)] for s, v in out["val_losses"]],
            "after": after,
            "word_overlap": round(word_overlap(after), 3),
        }
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{target} steps, {seconds:.0f} s, loss {losses[-1]:.3f}, "
              f"words of the corpus {record['word_overlap']:.0%}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--chunk", type=int, default=250)
    parser.add_argument("--ckpt", default=None, help="checkpoint folder (default: a new temp one)")
    parser.add_argument("--out", default=str(PATH))
    args = parser.parse_args()
    long_run(args.steps, args.chunk, args.ckpt or tempfile.mkdtemp(prefix="capstone-long-"),
             Path(args.out))
