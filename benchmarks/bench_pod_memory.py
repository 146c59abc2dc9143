"""How much memory a learner's pod needs: each chapter's peak PSS, as a Binder pod counts it.

    python benchmarks/bench_pod_memory.py                 # every chapter, one kernel each
    python benchmarks/bench_pod_memory.py 00 05 12        # some chapters
    python benchmarks/bench_pod_memory.py --sequence 00 02 12   # kernels left open, one after another

Each chapter runs in a fresh Jupyter kernel (``jupyter_client`` + ``nbclient``, every cell in
order, as nbval and a learner do), then the widget settings its text invites (``INVITED``). A
sampler thread adds up the proportional set size (PSS: each shared page divided among the
processes that share it, close to what a pod's memory limit counts) of the kernel and every
process below it — the warm rank server, the ranks, torchrun and its workers — every 20 ms, fast
enough for a sub-second 8-rank run; the peak is printed beside the same peak plus an idle
JupyterLab server, measured once at the start. ``--sequence`` leaves each kernel open and
reports the peak over all of them while the last chapter runs (a learner who never shuts a
chapter down); ``--gap SECONDS`` waits that long before each next chapter (a learner
reading). ``--idle SECONDS`` (default: the launcher's ``COURSE_HELPER_IDLE_SECONDS``, 120) is
the warm server's idle limit; after each chapter the table shows what its kernel's
helper processes hold once that limit has passed, if ``--wait-idle`` is given. ``--breakdown``
splits each peak by process role (kernel, warm server, ranks, torchrun, its workers), each PSS
with its USS (private pages) in brackets, and names the cell that ran then. Kernels get ``COURSE_PAUSE_SERVER=1`` unless it is set (torchrun ends
the idle rank server for its job, as the launcher's default does under a pod's memory limit).
``--restart-wait N`` only times the first ``run`` after an idle end, N times (min and median,
with the load), beside the fresh server's CPU seconds; ``--restart-ddp`` makes that run a DDP
step with an optimizer (what most chapters' runs do; its ranks need ``torch._dynamo``).
torchrun's workers are then forked from its agent, as in a pod
(:mod:`course_lib.launcher._forked_workers`); ``COURSE_TORCHRUN_WORKERS=fresh`` measures
torchrun's own fresh interpreters instead; the header names the mode.
"""
from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date

import nbformat
import psutil
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024 ** 3

# What each chapter's text invites a learner to try with its widget, beyond the defaults.
INVITED = {
    "12": ("from course_lib.capstone.show import train_widget\n"
           "w = train_widget()\n"
           "for name, value in (('layout', 'dp_shard 2 × tp 2'), ('preset', 'small'), "
           "('train', True)):\n"
           "    for c in w.children:\n"
           "        if getattr(c, 'description', '') == name:\n"
           "            c.value = value\n"),
}


def tree_pss(root_pids: list[int], roles: dict | None = None) -> int:
    """PSS in bytes of these processes and all their descendants (gone ones count 0); with
    ``roles``, also add each process's ``[PSS, USS]`` under its role (:func:`role_of`): USS is
    what the process holds alone (its private pages), what ending it would give back."""
    total, seen = 0, set()
    for pid in root_pids:
        try:
            root = psutil.Process(pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            continue
        for proc in procs:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                continue
            total += info.pss
            if roles is not None:
                split = roles.setdefault(role_of(proc, root_pids), [0, 0])
                split[0] += info.pss
                split[1] += info.uss
    return total


ROLES = ("kernel", "warm server", "ranks", "torchrun", "torchrun workers", "other")


def role_of(proc: psutil.Process, kernels: list[int]) -> str:
    """What a process in a kernel's tree is: the kernel, the warm rank server, a forked rank,
    torchrun (its reaper and agent), a torchrun worker, or something else."""
    def cmd(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    if proc.pid in kernels:
        return "kernel"
    try:
        parents = proc.parents()
    except psutil.Error:
        parents = []
    for parent in parents:  # a forked rank has its server's command line: look above it first
        if parent.pid in kernels:
            break
        line = cmd(parent)
        if "_warm import serve" in line:
            return "ranks"
        if "_reaper" not in line and ("_loopback_torchrun" in line
                                      or "torch.distributed.run" in line):
            return "torchrun workers"  # below the agent (the reaper's line names it too)
    line = cmd(proc)
    if "_warm import serve" in line:
        return "warm server"
    if "_reaper" in line or "_loopback_torchrun" in line or "torch.distributed.run" in line:
        return "torchrun"
    return "other"


def worker_mode_of_kernels() -> str:
    """How the kernels' torchrun starts its workers: the launcher's own answer, asked under
    the ``COURSE_PAUSE_SERVER`` the kernels get."""
    from unittest import mock

    from course_lib.launcher.torchrun import worker_mode
    with mock.patch.dict(os.environ, {"COURSE_PAUSE_SERVER":
                                      os.environ.get("COURSE_PAUSE_SERVER", "1")}):
        return worker_mode()


class Sampler:
    """Peak of :func:`tree_pss` over a block, sampled every ``interval`` seconds; ``roles`` is
    the peak sample's split by role and ``cell`` the index of the cell that ran then."""

    def __init__(self, roots: list[int], interval: float = 0.02):
        self.roots, self.interval, self.peak, self._stop = roots, interval, 0, threading.Event()
        self.roles: dict[str, list[int]] = {}
        self.cell, self.current = None, None

    def __enter__(self) -> "Sampler":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        roles: dict[str, list[int]] = {}
        cell = self.current
        total = tree_pss(self.roots, roles)
        if total > self.peak:
            self.peak, self.roles, self.cell = total, roles, cell

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def idle_server_pss() -> int:
    """PSS of an idle JupyterLab server on loopback (started, left 8 s, measured, stopped)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser",
                             f"--port={port}", "--ip=127.0.0.1", "--allow-root",
                             "--ServerApp.token=bench", f"--notebook-dir={ROOT}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(8)
        return tree_pss([proc.pid])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_chapter(path: str, km: KernelManager, sampler_roots: list[int]) -> "Sampler":
    """Execute every cell of ``path`` (and its invited widget settings) in ``km``'s kernel."""
    nb = nbformat.read(path, as_version=4)
    chapter = os.path.basename(path)[:2]
    if chapter in INVITED:
        nb.cells.append(nbformat.v4.new_code_cell(INVITED[chapter]))
    sampler = Sampler(sampler_roots)

    def started(cell, cell_index, **_):
        sampler.current = cell_index

    client = NotebookClient(nb, km=km, timeout=600, allow_errors=False, on_cell_start=started,
                            resources={"metadata": {"path": os.path.dirname(path)}})
    with sampler:
        client.execute()
    return sampler


def breakdown(sampler: "Sampler") -> str:
    """The peak sample split by role, PSS (USS), e.g. ``kernel 0.31 (0.29), ranks 0.18 (0.02)``."""
    parts = [f"{role} {sampler.roles[role][0] / GIB:.2f} ({sampler.roles[role][1] / GIB:.2f})"
             for role in ROLES if sampler.roles.get(role)]
    return f"cell {sampler.cell}: " + ", ".join(parts)


def start_kernel(idle: float | None) -> KernelManager:
    # IPC sockets in a private folder: no TCP port another user of the machine could reach
    km = KernelManager(kernel_name="python3", transport="ipc",
                       ip=os.path.join(tempfile.mkdtemp(prefix="bench-kernel-"), "kernel"))
    env = dict(os.environ)
    env.setdefault("COURSE_PAUSE_SERVER", "1")  # what "auto" does in a learner's pod (<= 4 GiB)
    if idle is not None:
        env["COURSE_HELPER_IDLE_SECONDS"] = str(idle)
    km.start_kernel(cwd=os.path.join(ROOT, "notebooks"), env=env)
    return km


def ddp_step() -> int:
    """One DDP training step with Adam (what most chapters' runs do first)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(64, 64))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
    return dist.get_rank()


def restart_wait(repeats: int, ddp: bool = False) -> None:
    """Time the first ``run`` after the idle limit ended the server, ``repeats`` times, in this
    process (torch imported first, as in a chapter's kernel), and the CPU seconds the fresh
    server spent before it was ready: on an otherwise idle core the wait is about that."""
    os.environ["COURSE_HELPER_IDLE_SECONDS"] = "1"
    import torch.distributed as dist

    from course_lib.launcher import launch
    fn = ddp_step if ddp else dist.get_rank
    launch.run(fn, 2)
    waits, cpus = [], []
    for _ in range(repeats):
        deadline = time.monotonic() + 120
        while launch._SERVERS._server is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        load = os.getloadavg()[0]
        start = time.monotonic()
        launch.run(fn, 2)
        waits.append(time.monotonic() - start)
        proc = psutil.Process(launch._SERVERS._server.proc.pid)
        cpu = proc.cpu_times()
        cpus.append(cpu.user + cpu.system)
        print(f"  first run after an idle end: {waits[-1]:.2f} s (the fresh server had used "
              f"{cpus[-1]:.2f} s of CPU; load {load:.1f})", flush=True)
    waits.sort(), cpus.sort()
    print(f"first {'DDP ' if ddp else ''}run after an idle end, {repeats} times: min {waits[0]:.2f} s, median "
          f"{waits[len(waits) // 2]:.2f} s; the server's CPU seconds: min {cpus[0]:.2f}, median "
          f"{cpus[len(cpus) // 2]:.2f}; {os.cpu_count()} CPUs", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("chapters", nargs="*", help="two-digit chapter numbers (default: all)")
    parser.add_argument("--sequence", action="store_true",
                        help="leave each kernel open; peak over all while the last one runs")
    parser.add_argument("--gap", type=float, default=0.0,
                        help="with --sequence: seconds between one chapter's end and the next "
                             "one's start (a learner reading on; past the idle limit the open "
                             "chapters' helpers have ended)")
    parser.add_argument("--idle", type=float, default=None,
                        help="the warm server's idle limit in seconds (default: the launcher's)")
    parser.add_argument("--wait-idle", action="store_true",
                        help="after each chapter wait the idle limit + 10 s and measure the "
                             "helper processes left")
    parser.add_argument("--restart-wait", type=int, metavar="N", default=0,
                        help="only time the first run after an idle end, N times, and stop")
    parser.add_argument("--restart-ddp", action="store_true",
                        help="with --restart-wait: that run is a 2-rank DDP step with Adam")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print the peak split by process role, and its cell")
    args = parser.parse_args()
    if args.restart_wait:
        restart_wait(args.restart_wait, args.restart_ddp)
        return
    paths = sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9][0-9]_*.ipynb")))
    if args.chapters:
        paths = [p for p in paths if os.path.basename(p)[:2] in args.chapters]
    server = idle_server_pss()
    print(f"{date.today()}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; idle JupyterLab server: {server / GIB:.2f} GiB PSS; "
          f"torchrun workers: {worker_mode_of_kernels()}")
    print(f"{'chapter':<36}{'kernel+children':>16}{'+ server':>10}{'idle helper':>13}")
    open_kernels: list[KernelManager] = []
    try:
        for number, path in enumerate(paths):
            if args.sequence and number:
                time.sleep(args.gap)
            km = start_kernel(args.idle)
            open_kernels.append(km)
            kernel_pid = km.provisioner.process.pid
            roots = [k.provisioner.process.pid for k in open_kernels] if args.sequence \
                else [kernel_pid]
            sampler = run_chapter(path, km, roots)
            peak = sampler.peak
            left = ""
            if args.wait_idle:
                limit = args.idle if args.idle is not None else float(
                    os.environ.get("COURSE_HELPER_IDLE_SECONDS", "120"))
                time.sleep(limit + 10)
                helpers = psutil.Process(kernel_pid).children(recursive=True)
                left = f"{tree_pss([p.pid for p in helpers]) / GIB:.2f} GiB"
            print(f"{os.path.basename(path):<36}{peak / GIB:>12.2f} GiB{(peak + server) / GIB:>7.2f}"
                  f" GiB{left:>13}", flush=True)
            if args.breakdown:
                print(f"    at the peak, {breakdown(sampler)} GiB", flush=True)
            if not args.sequence:
                km.shutdown_kernel(now=True)
                open_kernels.remove(km)
    finally:
        for km in open_kernels:
            km.shutdown_kernel(now=True)
        for folder in glob.glob(os.path.join(tempfile.gettempdir(), "bench-kernel-*")):
            if os.stat(folder).st_uid == os.getuid():
                shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
