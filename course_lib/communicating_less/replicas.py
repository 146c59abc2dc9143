"""Surviving a replica's failure without a restart (chapter 11): torchft on CPU with gloo.

:func:`survive_a_failure` starts ``python -m course_lib.communicating_less.replicas job``, which
enters a private network namespace first (torchft's lighthouse, managers, stores and its HTTP
checkpoint server have no authentication, and a recovering replica unpickles what a peer serves
with ``weights_only=False``: inside the namespace only this job can reach them). There it
starts a lighthouse and two replica groups of one rank each (forks of a zygote that imported
torch and torchft once: torchft's ``Manager``, ``ProcessGroupGloo``, ``OptimizerWrapper``; a
quorum per step), SIGKILLs replica 1 once it has reached step ``kill_at``, and starts it again
once the survivor has committed a step alone (a fork takes milliseconds, a real replacement
longer): the newcomer joins a later quorum and fetches the weights from its live peer. Both
stop at the first step at or past ``steps`` that they share. Every line is JSON, relayed as is.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import queue

import cloudpickle

from course_lib.common.checks import positive_int
from course_lib.launcher.launch import server_paused

PYTHON = [sys.executable, "-m", "course_lib.communicating_less.replicas"]


def _replica(train, index: int, lighthouse: str, steps: int, step_s: float) -> None:
    """One replica group: ``train`` (the chapter's loop) under torchft, a JSON line per step."""
    import hashlib
    from torch.distributed import TCPStore
    from course_lib.communicating_less.task import eval_loss
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # this group's store
    print(json.dumps({"replica": index, "started": time.time()}), flush=True)
    clock = [time.monotonic()]

    def log(step: int, participants: int, model) -> None:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                         for p in model.parameters())).hexdigest()[:16]
        print(json.dumps({"replica": index, "step": step, "participants": participants,
                          "weights": digest, "t": time.time()}), flush=True)
        time.sleep(max(0.0, step_s - (time.monotonic() - clock[0])))  # stands for a longer step
        clock[0] = time.monotonic()

    model = train(index, lighthouse, store.port, steps, log)
    print(json.dumps({"replica": index, "done": steps, "loss": eval_loss(model)}), flush=True)
    sys.stdout.flush()
    os._exit(0)


class _Zygote:
    """A fork of the job made before its lighthouse starts: torch, torchft and the task are
    imported once, and each replica (the restarted one too) is forked from it on request, not
    a fresh interpreter importing them again (seconds each on 2 cores, while the survivor waits).
    A replica dies with the zygote, which ends when the job closes its socket."""

    def __init__(self, train) -> None:
        import torch._dynamo  # noqa: F401 - the optimizer's first step imports it lazily
        import torch.nn.functional  # noqa: F401 - what the loop imports, imported here once
        from torchft import Manager, ProcessGroupGloo  # noqa: F401
        from torchft.ddp import DistributedDataParallel  # noqa: F401
        from torchft.optim import OptimizerWrapper  # noqa: F401
        from course_lib.communicating_less import task  # noqa: F401
        self.train = train
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                self.sock.close()
                self._serve(theirs)
            finally:
                os._exit(70)
        theirs.close()

    def _serve(self, sock: socket.socket) -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the replicas
        while True:
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 1)
            if not msg:
                os._exit(0)
            pid = os.fork()
            if pid == 0:  # a replica: stdout to the job's pipe, gone when the zygote goes
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                os.dup2(fds[0], 1)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
                _replica(self.train, *json.loads(msg))
                os._exit(0)
            os.close(fds[0])
            sock.send(struct.pack("!q", pid))

    def start(self, *args) -> "_Forked":
        read, write = os.pipe()
        socket.send_fds(self.sock, [json.dumps(args).encode()], [write])
        os.close(write)
        pid = struct.unpack("!q", self.sock.recv(8))[0]
        return _Forked(pid, os.fdopen(read, "r"))

    def close(self) -> None:
        self.sock.close()
        os.waitpid(self.pid, 0)


class _Forked:
    """A replica forked by the zygote: the part of ``Popen`` the job uses."""

    def __init__(self, pid: int, stdout) -> None:
        self.pid, self.stdout = pid, stdout

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -signal.SIGKILL
        return None

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> None:
        while self.poll() is None:
            time.sleep(0.01)


def _job(steps: int, kill_at: int, step_s: float, timeout: float, payload: bytes) -> None:
    """In a private network namespace: lighthouse, two replicas, one killed and restarted.

    The loop (``payload``, cloudpickled) is unpickled only once inside: unpickling imports
    torch, whose threads make the kernel refuse a normal user's ``unshare(CLONE_NEWUSER)``
    (EINVAL: a process with more than one thread cannot enter a new user namespace)."""
    from course_lib.launcher.netns import PrivateNetRefused, enter_private
    try:
        enter_private()
    except PrivateNetRefused as exc:
        print(json.dumps({"refused": f"no private network namespace: {exc}"}), flush=True)
        return
    zygote = _Zygote(cloudpickle.loads(payload))  # before the lighthouse's threads exist
    from torchft.coordination import LighthouseServer
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=500,
                                  heartbeat_timeout_ms=1000)
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    lines: queue.Queue = queue.Queue()
    procs = []

    def start(index: int) -> _Forked:
        proc = zygote.start(index, address, steps, step_s)
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
                victim.kill()
                victim.wait()
                print(json.dumps({"killed": 1, "t": time.time()}), flush=True)
                killed = True
            elif killed and victim.poll() is not None and row.get("participants") == 1:
                victim = start(1)  # back once the survivor has committed a step alone
            done += "done" in row
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        zygote.close()
        lighthouse.shutdown()


def survive_a_failure(steps: int = 30, kill_at: int = 8, step_s: float = 0.1,
                      timeout: float = 120.0, train=None) -> list[dict]:
    """Run the torchft job; return its JSON lines (steps, the kill, each replica's end).

    ``train(replica_id, lighthouse, store_port, steps, log)`` is each replica group's loop
    (default :func:`course_lib.communicating_less.ft_replica.train_replica`); a notebook cell's
    function travels to the job by value (cloudpickle), so a learner's edit runs there."""
    steps, kill_at = positive_int(steps, "steps"), positive_int(kill_at, "kill_at")
    if kill_at >= steps:
        raise ValueError(f"kill_at ({kill_at}) must come before the last step ({steps})")
    if not 0 <= step_s <= 5:
        raise ValueError(f"step_s must be between 0 and 5 seconds, got {step_s!r}")
    if train is None:
        from course_lib.communicating_less.ft_replica import train_replica as train
    if not callable(train):
        raise TypeError(f"train must be a function, got {type(train).__name__}")
    payload = cloudpickle.dumps(train)
    with server_paused():  # the job's zygote imports torch itself: no idle rank server beside it
        try:  # the job stops itself after `timeout`; this bounds its start and its cleanup too
            done = subprocess.run([*PYTHON, "job", str(steps), str(kill_at), str(step_s),
                                   str(timeout)], input=payload, capture_output=True,
                                  timeout=timeout + 30)
        except subprocess.TimeoutExpired as exc:
            said = (exc.stdout or b"").decode(errors="replace")
            last = [l for l in said.splitlines() if l.startswith("{")][-1:] or [None]
            raise TimeoutError(f"the torchft job did not end within {timeout + 30:g} s (its "
                               f"{timeout:g} s and 30 s to start and clean up); it was killed, "
                               f"and its replicas with it (last line: {last[0]})") from None
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    lines = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
    refused = next((l["refused"] for l in lines if "refused" in l), None)
    if refused:
        raise RuntimeError(refused)
    if any("timeout" in l for l in lines):
        raise TimeoutError(f"the torchft job did not finish within {timeout:g} s "
                           f"(last line: {lines[-2] if len(lines) > 1 else None})")
    if done.returncode != 0 or sum("done" in l for l in lines) != 2:
        tail = "\n".join(stderr.strip().splitlines()[-20:])
        raise RuntimeError(f"the torchft job failed (exit {done.returncode}):\n{tail}")
    return lines


def summarize(lines: list[dict]) -> dict:
    """What the run shows: the survivor's committed steps, the outage, the rejoin, the end.

    ``committed`` (the survivor's distinct steps, in order, ``first`` to ``final``: the first
    may be a peer's step it healed from), ``redone`` (its step lines that
    repeat a step: when its all-reduce failed because its peer died, its own ``should_commit``
    returned False and it redid the step), ``alone`` (steps it made with
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
    _job(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]),
         sys.stdin.buffer.read())  # the loop, pickled by the caller (its own user)
    sys.stdout.flush()
    os._exit(0)  # everything is closed: the interpreter's own shutdown took another second
