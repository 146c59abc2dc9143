"""Surviving a replica's failure without a restart (chapter 11): torchft on CPU with gloo.

:func:`survive_a_failure` starts ``python -m course_lib.communicating_less.replicas job``, which
enters a private network namespace first (torchft's lighthouse, managers, stores and its HTTP
checkpoint server have no authentication, and a recovering replica unpickles what a peer serves
with ``weights_only=False``: inside the namespace only this job can reach them). There it
starts a lighthouse and two replica groups of one rank each (``replica`` processes: torchft's
``Manager``, ``ProcessGroupGloo``, ``OptimizerWrapper``; a quorum per step), SIGKILLs replica 1
once it has reached step ``kill_at``, and starts it again at once: the survivor goes on
alone, the newcomer joins a later quorum and fetches the weights from its live peer. Both stop
at the first step at or past ``steps`` that they share. Every line is JSON, relayed as is.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import queue

from course_lib.common.checks import positive_int

PYTHON = [sys.executable, "-m", "course_lib.communicating_less.replicas"]


def _replica(index: int, lighthouse: str, steps: int, step_s: float) -> None:
    """One replica group: train the chapter's student under a torchft Manager, a line per step."""
    from datetime import timedelta
    import hashlib
    import torch
    import torch.nn.functional as F
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.optim import OptimizerWrapper
    from course_lib.common.models import MLP
    from course_lib.communicating_less.measure import SEED, SIZES, eval_loss, task_batch
    torch.manual_seed(SEED + index)  # different weights: only a fetch from the peer equals them
    model = MLP(SIZES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    wait = timedelta(seconds=30)
    manager = Manager(pg=ProcessGroupGloo(timeout=wait), min_replica_size=1,
                      load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                                  opt.load_state_dict(sd["opt"])),
                      state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
                      replica_id=f"replica{index}", store_addr="127.0.0.1",
                      store_port=store.port, rank=0, world_size=1, lighthouse_addr=lighthouse,
                      hostname="127.0.0.1", timeout=wait, quorum_timeout=wait,
                      connect_timeout=wait)
    optim = OptimizerWrapper(manager, opt)
    print(json.dumps({"replica": index, "started": time.time()}), flush=True)
    while True:
        start = time.monotonic()
        optim.zero_grad()                  # starts this step's quorum
        x, y = task_batch(manager.current_step(), index)
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():       # averaged over the replicas in this step's quorum
            manager.allreduce(p.grad).wait()
        optim.step()                       # applied only if every participant commits
        step, n = manager.current_step(), manager.num_participants()
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                         for p in model.parameters())).hexdigest()[:16]
        print(json.dumps({"replica": index, "step": step, "participants": n,
                          "weights": digest, "t": time.time()}), flush=True)
        if step >= steps and n == 2:
            break
        time.sleep(max(0.0, step_s - (time.monotonic() - start)))  # stands for a longer step
    print(json.dumps({"replica": index, "done": step, "loss": eval_loss(model)}), flush=True)
    sys.stdout.flush()
    os._exit(0)


def _job(steps: int, kill_at: int, step_s: float, timeout: float) -> None:
    """In a private network namespace: lighthouse, two replicas, one killed and restarted."""
    from course_lib.launcher import _private_net
    try:
        _private_net.enter()
    except _private_net.Refused as exc:
        print(json.dumps({"refused": f"no private network namespace: {exc}"}), flush=True)
        return
    from torchft.coordination import LighthouseServer
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=500,
                                  heartbeat_timeout_ms=1000)
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    lines: queue.Queue = queue.Queue()
    procs = []

    def start(index: int) -> subprocess.Popen:
        proc = subprocess.Popen([*PYTHON, "replica", str(index), address, str(steps),
                                 str(step_s)], stdout=subprocess.PIPE, text=True,
                                stderr=subprocess.DEVNULL)
        threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] and None,
                         daemon=True).start()
        procs.append(proc)
        return proc

    begin, deadline = time.time(), time.monotonic() + timeout
    print(json.dumps({"begin": begin}), flush=True)
    victim = [start(0), start(1)][1]
    done, killed = 0, False
    try:
        while done < 2:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                print(json.dumps({"timeout": timeout}), flush=True)
                return
            print(line.strip(), flush=True)
            row = json.loads(line)
            if row.get("replica") == 1 and row.get("step", -1) >= kill_at and not killed:
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                print(json.dumps({"killed": 1, "t": time.time()}), flush=True)
                killed = True
                victim = start(1)
            done += "done" in row
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        lighthouse.shutdown()


def survive_a_failure(steps: int = 30, kill_at: int = 8, step_s: float = 0.1,
                      timeout: float = 120.0) -> list[dict]:
    """Run the torchft job; return its JSON lines (steps, the kill, each replica's end)."""
    steps, kill_at = positive_int(steps, "steps"), positive_int(kill_at, "kill_at")
    if kill_at >= steps:
        raise ValueError(f"kill_at ({kill_at}) must come before the last step ({steps})")
    if not 0 <= step_s <= 5:
        raise ValueError(f"step_s must be between 0 and 5 seconds, got {step_s!r}")
    done = subprocess.run([*PYTHON, "job", str(steps), str(kill_at), str(step_s), str(timeout)],
                          capture_output=True, text=True, timeout=timeout + 30)
    lines = [json.loads(l) for l in done.stdout.splitlines() if l.startswith("{")]
    refused = next((l["refused"] for l in lines if "refused" in l), None)
    if refused:
        raise RuntimeError(refused)
    if any("timeout" in l for l in lines):
        raise TimeoutError(f"the torchft job did not finish within {timeout:g} s "
                           f"(last line: {lines[-2] if len(lines) > 1 else None})")
    if done.returncode != 0 or sum("done" in l for l in lines) != 2:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise RuntimeError(f"the torchft job failed (exit {done.returncode}):\n{tail}")
    return lines


def summarize(lines: list[dict]) -> dict:
    """What the run shows: the survivor's committed steps, the outage, the rejoin, the end.

    ``committed`` (the survivor's distinct steps, in order, ``first`` to ``final``: the first
    may be a peer's step it healed from), ``redone`` (its step lines that
    repeat a step: a quorum that lost a member commits nothing), ``alone`` (steps it made with
    one participant while replica 1 was away), ``stall_s`` (longest gap between its steps),
    ``rejoined_at`` (replica 1's first step after the kill, fetched from the peer),
    ``equal`` (both ended on the same weights), ``wall_s``.
    """
    kill = next(l["t"] for l in lines if "killed" in l)
    mine = [l for l in lines if l.get("replica") == 0 and "step" in l]
    steps = [l["step"] for l in mine]
    back = [l for l in lines if l.get("replica") == 1 and "step" in l and l["t"] > kill]
    last = {l["replica"]: l["weights"] for l in lines if "weights" in l}
    gaps = [b["t"] - a["t"] for a, b in zip(mine, mine[1:])]
    return {"committed": sorted(set(steps)), "redone": len(steps) - len(set(steps)),
            "alone": sum(1 for l in mine if l["t"] > kill and l["participants"] == 1),
            "stall_s": max(gaps), "rejoined_at": back[0]["step"] if back else None,
            "equal": last.get(0) == last.get(1), "first": min(steps), "final": max(steps),
            "wall_s": max(l["t"] for l in mine) - next(l["begin"] for l in lines if "begin" in l)}


if __name__ == "__main__":
    if sys.argv[1] == "replica":
        _replica(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    else:
        _job(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
