"""Fault-injection harness for chapter 6: kill ranks at random, check that nothing is lost.

Each trial runs ``course_lib/fault_tolerance/train_ft.py`` under ``torchrun --max-restarts=K`` with a
random plan of K faults, one per attempt, at strictly increasing steps on random ranks:

* ``kill``     — the rank SIGKILLs itself before a step (env var ``COURSE_FT_FAULTS``);
* ``raise``    — the rank raises an exception before a step;
* ``save``     — the rank dies after writing its shards of a checkpoint, before the commit marker;
* ``external`` — (last attempt only) this harness SIGKILLs a random worker from outside, once
  that attempt has committed a checkpoint at or past a random step.

A trial passes when torchrun ends successfully after exactly K restarts, the final parameters
and the whole loss curve are bit-identical (``torch.equal``) to an uninterrupted run (launched
with ``course_lib.run``, no checkpoints at all), and no process of the trial is left (psutil).

    python benchmarks/fault_harness.py --trials 20          # prints "N passed, M failed"

Tests import :func:`run_trials` and run 2 trials.
"""
from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from course_lib import TorchrunError, run, torchrun
from course_lib.fault_tolerance.checkpoint import latest_checkpoint
from course_lib.fault_tolerance.training import FAULTS_ENV, Fault, format_faults, train

SCRIPT = "course_lib.fault_tolerance.train_ft"


@dataclass
class TrialResult:
    plan: list
    passed: bool
    reason: str
    seconds: float
    restarts: int = -1
    external: dict = field(default_factory=dict)


def reference(preset: str, steps: int, seed: int, nprocs: int) -> dict:
    """The uninterrupted run: same training, no checkpoints, no faults (rank 0's result)."""
    return run(train, nprocs, preset, steps, every=0, seed=seed)[0]


def random_plan(rng: random.Random, steps: int, every: int, nprocs: int, max_faults: int,
                external: bool = True) -> list[tuple[str, int, int]]:
    """``[(kind, rank, step), ...]``, one per attempt, steps strictly increasing."""
    n = rng.randint(1, max_faults)
    kinds = ["kill", "raise", "save"] + (["external"] if external else [])
    plan, low = [], 1
    for i in range(n):
        last = i == n - 1
        kind = rng.choice(kinds if last else kinds[:3])
        if kind == "external" and low > steps - 2 * every:
            kind = "kill"  # too late to be sure the kill lands before training ends
        room = steps - 2 * every if kind == "external" else steps - 1 - (n - 1 - i)
        if kind == "save":
            saves = [s for s in range(every, steps + 1, every) if s >= low and s <= room + 1]
            if not saves:
                kind = "kill"
            else:
                step = rng.choice(saves)
        if kind != "save":
            step = rng.randint(low, max(low, room))
        plan.append((kind, rng.randrange(nprocs), step))
        low = step + 1
    return plan


def _trial_processes(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if tag in cmd and proc.pid != psutil.Process().pid:
            found.append(proc)
    return found


def _workers(tag: str, attempt: int) -> list[psutil.Process]:
    procs = []
    for proc in _trial_processes(tag):
        try:
            cmd = " ".join(proc.cmdline())
            env = proc.environ()
        except psutil.Error:
            continue
        if "torch.distributed.run" not in cmd and "_reaper" not in cmd and \
                env.get("TORCHELASTIC_RESTART_COUNT") == str(attempt):
            procs.append(proc)
    return procs


def _external_killer(tag: str, ckpt: Path, attempt: int, step: int, rank: int, nprocs: int,
                     stop: threading.Event, record: dict) -> None:
    """Wait until ``attempt`` committed checkpoint >= ``step``, then SIGKILL one of its workers."""
    while not stop.is_set():
        latest = latest_checkpoint(ckpt)
        workers = _workers(tag, attempt)
        if latest is not None and int(latest.name[5:]) >= step and len(workers) == nprocs:
            victim = sorted(workers, key=lambda p: p.pid)[rank]
            try:
                victim.send_signal(signal.SIGKILL)
                record.update(killed=victim.pid, at_checkpoint=latest.name)
            except psutil.Error:
                pass
            return
        time.sleep(0.05)


def run_trial(plan: list[tuple[str, int, int]], ref: dict, *, preset: str = "tiny",
              steps: int = 12, every: int = 3, seed: int = 0, nprocs: int = 2,
              timeout: float = 300.0, workdir: str | None = None) -> TrialResult:
    """Run one plan under torchrun; compare with ``ref``; look for leftover processes."""
    start = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="fault_trial_", dir=workdir))
    ckpt, out = base / "ckpt", base / "final.pt"
    internal = [Fault(i, r, s, k) for i, (k, r, s) in enumerate(plan) if k != "external"]
    env = {FAULTS_ENV: format_faults(internal)}
    record: dict = {}
    stop = threading.Event()
    killer = None
    if plan and plan[-1][0] == "external":
        _, rank, step = plan[-1]
        killer = threading.Thread(target=_external_killer, daemon=True,
                                  args=(str(ckpt), ckpt, len(plan) - 1, step, rank, nprocs,
                                        stop, record))
        killer.start()
    args = ["--preset", preset, "--steps", steps, "--every", every, "--seed", seed,
            "--ckpt-dir", ckpt, "--out", out]
    result = TrialResult(plan, False, "", 0.0, external=record)
    try:
        res = torchrun(SCRIPT, nprocs, args, module=True, max_restarts=len(plan), env=env,
                       timeout=timeout, quiet=True)
        finals = [ln for ln in res.output.splitlines() if "final loss" in ln]
        result.restarts = int(finals[-1].split("attempt ")[1].split(":")[0]) if finals else -1
        got = torch.load(out, weights_only=True)
        same_params = set(got["params"]) == set(ref["params"]) and all(
            torch.equal(got["params"][k], ref["params"][k]) for k in ref["params"])
        same_losses = torch.equal(got["losses"], torch.tensor(ref["losses"], dtype=torch.float64))
        if result.restarts != len(plan):
            result.reason = f"{result.restarts} restarts, expected {len(plan)} (a fault missed)"
        elif not (same_params and same_losses):
            result.reason = f"differs from the uninterrupted run (params equal: {same_params}, " \
                            f"losses equal: {same_losses})"
        else:
            result.passed = True
    except (TorchrunError, TimeoutError, OSError) as exc:
        result.reason = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        stop.set()
        if killer is not None:
            killer.join(5)
    _, alive = psutil.wait_procs(_trial_processes(str(base)), timeout=10)
    if alive:
        result.passed = False
        result.reason += f" processes left behind: {[p.pid for p in alive]}"
        for proc in alive:
            proc.kill()
    shutil.rmtree(base, ignore_errors=True)
    result.seconds = time.monotonic() - start
    return result


def run_trials(n: int, seed: int | None = None, *, preset: str = "tiny", steps: int = 12,
               every: int = 3, nprocs: int = 2, max_faults: int = 2, external: bool = True,
               verbose: bool = True, workdir: str | None = None) -> list[TrialResult]:
    """``n`` random trials (reproducible with ``seed``); prints one line per trial if verbose."""
    rng = random.Random(seed)
    ref = reference(preset, steps, 0, nprocs)
    results = []
    for i in range(n):
        plan = random_plan(rng, steps, every, nprocs, max_faults, external)
        res = run_trial(plan, ref, preset=preset, steps=steps, every=every, nprocs=nprocs,
                        workdir=workdir)
        results.append(res)
        if verbose:
            mark = "pass" if res.passed else "FAIL " + res.reason
            extra = f" external kill {res.external}" if res.external else ""
            print(f"trial {i + 1:2d}: plan {plan} restarts {res.restarts} "
                  f"{res.seconds:5.1f} s: {mark}{extra}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh random seed")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--max-faults", type=int, default=2)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    print(f"seed {seed}: {args.trials} trials, {args.nprocs} ranks, {args.steps} steps, "
          f"checkpoint every {args.every}", flush=True)
    results = run_trials(args.trials, seed, preset=args.preset, steps=args.steps,
                         every=args.every, nprocs=args.nprocs, max_faults=args.max_faults)
    passed = sum(r.passed for r in results)
    print(f"{passed} passed, {len(results) - passed} failed "
          f"({sum(r.seconds for r in results):.0f} s)")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
