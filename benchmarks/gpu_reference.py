"""The course's speed experiments on CUDA/NCCL: overlap (02), strong scaling (05), bubble (04).

    python benchmarks/gpu_reference.py                   # on a machine with >= 2 GPUs
    python benchmarks/gpu_reference.py --dry-run          # gloo on CPU, tiny sizes (CI)

Each experiment runs on real ranks through ``course_lib.run`` (NCCL, one GPU per rank) and
writes ``data/gpu_reference.json``: the GPU, date, torch and NCCL versions, and per experiment
the measured numbers and the lines chapters 02, 04, 05 and 09 print under their published
figures (``course_lib.common.published.show_published``; the notebooks skip it silently when
the file is absent). Times come from ``time.perf_counter`` around ``torch.cuda.synchronize``.
``--dry-run`` checks the same code paths on gloo/CPU with tiny sizes and writes only where
``--out`` says (never the notebooks' file: a CPU run is not a GPU reference).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from course_lib.common.models import GPT, MLP, GPTConfig
from course_lib.common.published import GPU_REFERENCE_PATH
from course_lib.launcher.launch import run
from course_lib.pipeline_parallel.measure import bubble_formula, measured_bubble
from course_lib.pipeline_parallel.schedules import Stage, StageSteps, run_schedule
from course_lib.pipeline_parallel.trace import StageTrace, TracedSteps

SIZES = {"gpu": dict(mlp=(4096, 8192, 8192, 8192, 4096), batch=256, gpt=GPTConfig(
             n_layer=8, n_head=16, d_model=2048, seq_len=1024, vocab_size=32000), micro=2, steps=10),
         "dry": dict(mlp=(64, 128, 64), batch=16, gpt=GPTConfig(
             n_layer=2, n_head=2, d_model=32, seq_len=16), micro=2, steps=2)}


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median_time(fn, dev: torch.device, steps: int) -> float:
    fn()                                  # warm-up: allocator, NCCL communicators, kernels
    times = []
    for _ in range(steps):
        _sync(dev)
        start = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ddp_rank(sizes, batch: int, steps: int) -> dict:
    """Compute alone, one all-reduce of all gradients alone, DDP's overlapped step, the serial step."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    dev, world = _device(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(MLP(sizes).to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
    x, y = torch.randn(batch, sizes[0], device=dev), torch.randn(batch, sizes[-1], device=dev)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()), device=dev)

    def compute():
        with model.no_sync():
            torch.nn.functional.mse_loss(model(x), y).backward()

    def comm():
        dist.all_reduce(flat)

    def overlapped():
        torch.nn.functional.mse_loss(model(x), y).backward()

    def serial():   # backward first, then every gradient in one all-reduce: nothing overlaps
        compute()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(grads)
        grads /= world

    out = {name: _median_time(fn, dev, steps) for name, fn in
           (("compute_s", compute), ("comm_s", comm), ("step_overlapped_s", overlapped),
            ("step_serial_s", serial))}
    return out


class _DeviceSteps(TracedSteps):
    """TracedSteps whose receives land on the stage's device and whose timing waits for it."""

    def __init__(self, stage, targets, trace, dev):
        super().__init__(stage, targets, trace)
        self.dev = dev

    def post(self, kind, i, shape, src):  # run_schedule posts a receive ahead; recv waits on it
        x = torch.empty(shape, device=self.dev)
        self.posted[(kind, i)] = (x, dist.irecv(x, src=src))

    def recv(self, kind, i, shape, src):
        start = time.perf_counter()
        x = StageSteps.recv(self, kind, i, shape, src)
        _sync(self.dev)
        self.trace.waits.append((kind, i, start, time.perf_counter()))
        return x

    def _timed(self, kind, i, step, *args):
        _sync(self.dev)
        start = time.perf_counter()
        out = step(*args)
        _sync(self.dev)
        end = time.perf_counter()
        self.trace.events.append((kind, i, start, end))
        self.trace.cpu.append(end - start)
        return out


def _pipeline_rank(config: GPTConfig, ms, micro: int, steps: int) -> dict:
    dev, rank = _device(), dist.get_rank()
    runs = {}
    for schedule in ("gpipe", "1f1b"):
        for m in ms:
            torch.manual_seed(0)
            stage = Stage(GPT(config), rank, dist.get_world_size()).to(dev)
            idx = torch.randint(config.vocab_size, (m * micro, config.seq_len), device=dev)
            micro_in, micro_tg = list(idx.chunk(m)), list(idx.roll(-1, 1).chunk(m))
            traces = []
            for _ in range(1 + steps):
                stage.zero_grad(set_to_none=True)
                traces.append(StageTrace(rank))
                dist.barrier()
                run_schedule(_DeviceSteps(stage, micro_tg, traces[-1], dev), schedule, micro_in,
                             (micro, config.seq_len, config.d_model))
            runs[f"{schedule}/{m}"] = traces[1:]
    return runs


def _launch(fn, world: int, dry: bool, *args):
    kind = dict(backend="gloo", device="cpu", threads=1) if dry else dict(backend="nccl", device="cuda")
    return run(fn, world, *args, timeout=600, **kind)


def experiments(dry: bool, world: int = 2) -> dict:
    size = SIZES["dry" if dry else "gpu"]
    over = _launch(_ddp_rank, world, dry, size["mlp"], size["batch"], size["steps"])
    over = {k: max(r[k] for r in over) for k in over[0]}
    hidden = over["step_serial_s"] - over["step_overlapped_s"]
    overlap = {**over, "lines": [
        f"DDP on {world} GPUs: compute {over['compute_s'] * 1e3:.2f} ms, one all-reduce of all "
        f"gradients {over['comm_s'] * 1e3:.2f} ms; step overlapped {over['step_overlapped_s'] * 1e3:.2f} ms "
        f"vs serial {over['step_serial_s'] * 1e3:.2f} ms (overlap hid {hidden * 1e3:.2f} ms)"]}
    steps = {}
    for w in (1, world):
        res = _launch(_ddp_rank, w, dry, size["mlp"], size["batch"] // w, size["steps"])
        steps[w] = max(r["step_overlapped_s"] for r in res)
    speedup = steps[1] / steps[world]
    scaling = {"step_s": {str(w): t for w, t in steps.items()}, "speedup": speedup, "lines": [
        f"strong scaling, global batch {size['batch']}: 1 GPU {steps[1] * 1e3:.2f} ms, {world} GPUs "
        f"{steps[world] * 1e3:.2f} ms per step: speedup {speedup:.2f} (ideal {world})"]}
    ms = (1, 2, 4, 8)
    per_rank = _launch(_pipeline_rank, world, dry, size["gpt"], ms, size["micro"], size["steps"])
    rows, lines = [], []
    for key in per_rank[0]:
        schedule, m = key.split("/")
        budgets = [measured_bubble(list(t)) for t in zip(*(r[key] for r in per_rank))]
        b = statistics.median(x.bubble_fraction for x in budgets)
        rows.append({"schedule": schedule, "m": int(m), "bubble": b,
                     "formula": bubble_formula(world, int(m))})
        lines.append(f"{schedule} p={world} m={m}: bubble measured {b:.3f}, formula "
                     f"{bubble_formula(world, int(m)):.3f}")
    return {"overlap": overlap, "scaling": scaling, "bubble": {"rows": rows, "lines": lines}}


def _nccl_version() -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def meta(dry: bool) -> dict:
    cuda = torch.cuda.is_available() and not dry
    return {"gpu": torch.cuda.get_device_name(0) if cuda else "none (dry run: gloo on CPU)",
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "nccl": _nccl_version() if cuda else "n/a",
            "dry_run": dry}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="gloo on CPU, tiny sizes")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the JSON (default {GPU_REFERENCE_PATH} on GPUs; "
                             "a dry run writes only here)")
    args = parser.parse_args(argv)
    if not args.dry_run and torch.cuda.device_count() < 2:
        print("needs 2 CUDA GPUs (or --dry-run); nothing written", file=sys.stderr)
        return 2
    out = args.out or (None if args.dry_run else GPU_REFERENCE_PATH)
    data = {"meta": meta(args.dry_run), "experiments": experiments(args.dry_run)}
    for exp in data["experiments"].values():
        print("\n".join(exp["lines"]))
    if out is not None:
        out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
