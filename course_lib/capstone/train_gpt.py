r"""Train the course GPT on any dense layout of chapter 09, under torchrun, resuming after a crash.

The rank side of ``course_lib.train_gpt`` (chapter 12), launched by torchrun, for example
``torchrun --standalone --nproc-per-node=4 --max-restarts=3 -m course_lib.capstone.train_gpt
--config course_lib/capstone/train_gpt.toml --layout dp_shard=2,tp=2 --ckpt-dir "$(mktemp -d)"``.
Options: a TOML file (torchtitan's sections), the command line wins; ``--layout ""`` is one process.
``COURSE_FT_FAULTS=attempt:rank:step:kind`` fails a rank on purpose (chapter 06's faults).
``--standalone`` is for your own machine only: torchrun's stores have no authentication (on a
shared machine use ``course_lib.torchrun``; ``course_lib.capstone.cluster`` writes Slurm and
Kubernetes files). ``--device auto`` (the default) is ``course_lib.launcher.devices.place``'s
choice for this node's ranks (NCCL, one GPU per rank, where there are enough; else CPU + gloo).
Rank 0 writes ``{"losses", "params"}`` to ``--out`` (``torch.load(path, weights_only=True)``).
"""
from __future__ import annotations

import argparse
import os
import tomllib

import torch

from course_lib.capstone.measure import validate_run
from course_lib.capstone.train import train_rank_capstone
from course_lib.composition.layout import Layout
from course_lib.fault_tolerance.faults import FAULTS_ENV, parse_faults
from course_lib.launcher.devices import DEVICE_CHOICES, place
from course_lib.launcher.torchrun import init_distributed

#: TOML section -> the options it may hold
SECTIONS = {"model": ("preset",), "training": ("steps", "batch_size", "lr", "seed", "eval_every"),
            "parallelism": ("layout",), "checkpoint": ("ckpt_dir", "every", "keep")}
DEFAULTS = {"preset": "tiny", "steps": 12, "batch_size": 8, "lr": 3e-3, "seed": 0,
            "eval_every": 0, "layout": {}, "ckpt_dir": "", "every": 0, "keep": 2}


def parse_layout(text: str) -> dict[str, int]:
    """``"dp_shard=2,tp=2"`` -> ``{"dp_shard": 2, "tp": 2}``; ``""`` -> ``{}``."""
    pairs = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, size = item.partition("=")
        if not sep or not size.isdigit():
            raise ValueError(f"bad layout item {item!r}: expected name=size, e.g. dp_shard=2")
        pairs.append((name.strip(), int(size)))
    return dict(pairs)


def read_config(path: str) -> dict:
    """The options a TOML file sets (unknown sections or keys are an error, not ignored)."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = {}
    for section, values in data.items():
        if section not in SECTIONS or not isinstance(values, dict):
            raise ValueError(f"{path}: unknown section [{section}]; known: {sorted(SECTIONS)}")
        for key, value in values.items():
            if key not in SECTIONS[section]:
                raise ValueError(f"{path}: [{section}] has no option {key!r}; "
                                 f"known: {SECTIONS[section]}")
            out[key] = value
    return out


def parse_args(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="", help="a TOML file of options")
    parser.add_argument("--preset")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int, help="global batch, in sequences")
    parser.add_argument("--lr", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--eval-every", type=int)
    parser.add_argument("--layout", help='e.g. "dp_shard=2,tp=2"; "" = one process')
    parser.add_argument("--ckpt-dir")
    parser.add_argument("--every", type=int, help="checkpoint every N steps (0: never)")
    parser.add_argument("--keep", type=int)
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                        help="cuda + NCCL where a GPU is seen (auto), or force cpu / cuda")
    parser.add_argument("--faults", default=os.environ.get(FAULTS_ENV, ""))
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    options = {**DEFAULTS, **(read_config(args.config) if args.config else {})}
    for key in DEFAULTS:
        value = getattr(args, key)
        if value is not None:
            options[key] = parse_layout(value) if key == "layout" else value
    options["faults"], options["out"] = parse_faults(args.faults), args.out
    layout_now = Layout.parse(options["layout"], ranks=None)
    placement = place(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), None, args.device,
                      threads=1, pipeline=layout_now.pp > 1)  # this node's ranks
    options["device"], options["backend"] = placement.device, placement.backend
    return options


def main(argv: list[str] | None = None) -> dict:
    o = parse_args(argv)  # a typo fails here, before any process group exists
    layout, config = validate_run(o["layout"], o["preset"], o["steps"], o["batch_size"],
                               o["ckpt_dir"] or None)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if layout.world != world:
        raise SystemExit(f"layout {layout} needs {layout.world} ranks, torchrun started {world}")
    if o["device"] == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    rank, _ = init_distributed(o["backend"])
    result = train_rank_capstone(config, layout, o["steps"], batch_size=o["batch_size"] // layout.dp_size,
                                 lr=o["lr"], seed=o["seed"], eval_every=o["eval_every"],
                                 ckpt_dir=o["ckpt_dir"] or None, every=o["every"], keep=o["keep"],
                                 faults=o["faults"], device=o["device"])
    if rank == 0:
        start = result["resumed_from"]
        print(f"attempt {result['attempt']}: layout {layout}, "
              f"{'resumed from step ' + str(start) if start is not None else 'started fresh'}, "
              f"final loss {result['losses'][-1]:.4f} on {o['device']} ({o['backend']})",
              flush=True)
        if o["out"]:
            torch.save({"losses": torch.tensor(result["losses"], dtype=torch.float64),
                        "params": result["params"]}, o["out"])
    return result


if __name__ == "__main__":
    main()
