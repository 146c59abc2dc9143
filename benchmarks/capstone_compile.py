"""What ``torch.compile`` changes for chapter 12's model: compile seconds against step time.

    python benchmarks/capstone_compile.py [--steps 30] [--threads 1]

The course GPT (``small`` preset, a batch of 8 sequences, AdamW) in one process, eager and with
every block compiled (``torch.compile`` per block, as torchtitan's ``--compile`` does: the
blocks are alike, so one compiled graph serves them all). Per mode: the first step's seconds
(the compile happens inside it), the median of the next ``steps`` (the two modes' steps
interleaved, so a busy machine slows both alike), and the loss after them
(compiled and eager train the same model: the two agree to float rounding). Writes
``data/capstone_compile.json`` with the date, the machine and the settings; chapter 12 shows it,
labelled as a stored run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from course_lib.capstone.data import DataOrder, Windows, split_corpus  # noqa: E402
from course_lib.common.models import GPT, get_config  # noqa: E402

PATH = ROOT / "data" / "capstone_compile.json"
SETTINGS = {"preset": "small", "batch_size": 8, "lr": 3e-3, "seed": 0}


def _setup(compiled: bool):
    config = get_config(SETTINGS["preset"])
    torch.manual_seed(SETTINGS["seed"])
    model = GPT(config)
    if compiled:
        for block in model.blocks:
            block.compile()                      # nn.Module.compile: torch.compile in place
    opt = torch.optim.AdamW(model.parameters(), lr=SETTINGS["lr"])
    order = DataOrder(Windows(split_corpus()[0], config.seq_len), SETTINGS["batch_size"], 0, 1,
                      SETTINGS["seed"])
    return model, opt, order


def _step(model, opt, order) -> tuple[float, float]:
    x, y = order.next_batch()
    t0 = time.perf_counter()
    loss = GPT.loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0, loss.item()


def both_modes(steps: int) -> dict:
    """Eager and compiled, their steps interleaved (a busy machine slows both alike)."""
    runs = {mode: _setup(mode == "compiled") for mode in ("eager", "compiled")}
    out = {}
    for mode, run in runs.items():
        first, _ = _step(*run)               # compiled: tracing and code generation happen here
        out[mode] = {"first_step_s": round(first, 3), "seconds": [], "loss": None}
    for _ in range(steps):
        for mode, run in runs.items():
            seconds, loss = _step(*run)
            out[mode]["seconds"].append(seconds)
            out[mode]["loss"] = loss
    return {mode: {"first_step_s": r["first_step_s"],
                   "step_s": round(statistics.median(r["seconds"]), 5),
                   "final_loss": round(r["loss"], 5)} for mode, r in out.items()}


def main(steps: int, threads: int, path: Path = PATH) -> dict:
    torch.set_num_threads(threads)
    modes = both_modes(steps)
    record = {
        "what": "chapter 12's model, eager and with torch.compile per block "
                "(benchmarks/capstone_compile.py)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, {platform.system()}, "
                   f"{threads} torch thread(s), torch {torch.__version__}",
        "settings": {**SETTINGS, "steps": steps},
        "eager": modes["eager"], "compiled": modes["compiled"],
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(PATH))
    args = parser.parse_args()
    main(args.steps, args.threads, Path(args.out))
