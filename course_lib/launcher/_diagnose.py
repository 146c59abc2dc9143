"""Diagnosis for :func:`course_lib.run` (chapter 10): debug level, stacks of a hang, crash summary.

* ``debug=`` sets torch.distributed's debug level in each rank before ``init_process_group``
  (``TORCH_DISTRIBUTED_DEBUG`` is read at ``import torch``: too early for ranks forked from the
  warm server). At ``"detail"`` torch wraps the group in its collective-consistency checker.
* Each rank arms ``faulthandler`` on SIGUSR1, writing into a file of the private run folder.
  On a timeout the parent signals every unfinished rank *before* killing it and reads what each
  was doing (Python frames, any thread, even inside a blocking C call), within ``STACK_WAIT_S``.
* A rank that died in a collective (gloo's "Received data size doesn't match expected size",
  SIGABRT), a mismatch found at ``"detail"`` or an allocator out of memory gets one line;
  a rank whose error only says its peer went away is not blamed when a peer died.
"""
from __future__ import annotations

import contextlib
import linecache
import os
import re
import signal
import time
from pathlib import Path

from course_lib.common.deprecation import renamed

LEVELS = ("off", "info", "detail")
STACK_WAIT_S = 2.0  # at most this long to collect the stacks of a hang
PEER_WAIT_S = 1.0   # a rank that lost its peer: this long to see whether the peer died
_LAUNCHER = os.path.dirname(os.path.abspath(__file__))


def validate_debug(debug: str | None) -> str | None:
    """``debug`` lower-cased if it is ``None`` or one of :data:`LEVELS`; a ValueError otherwise."""
    if debug is None:
        return None
    if not isinstance(debug, str) or debug.lower() not in LEVELS:
        raise ValueError(f"debug must be None or one of {list(LEVELS)} (torch.distributed's "
                         f"TORCH_DISTRIBUTED_DEBUG levels), got {debug!r}")
    return debug.lower()


__getattr__ = renamed(__name__, {"check_debug": "validate_debug"})  # before issue 32


def apply_debug(level: str | None) -> None:
    """In a rank, before ``init_process_group``: set torch.distributed's debug level."""
    if level is None:  # the notebook's environment may still ask for one
        level = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").lower()
        if level not in LEVELS:
            return
    import torch.distributed as dist
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = level.upper()
    dist.set_debug_level(getattr(dist.DebugLevel, level.upper()))


def stack_file(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"stack-{rank}")


def arm_stack_dump(run_dir: str, rank: int):
    """In a rank: SIGUSR1 writes every thread's Python stack to this rank's stack file."""
    import faulthandler
    dump = open(stack_file(run_dir, rank), "w")  # noqa: SIM115 - faulthandler keeps it open
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    return dump


def collect_stacks(pids: dict[int, int], run_dir: str, wait: float = STACK_WAIT_S) -> dict:
    """``{rank: stack text}`` of the ranks ``pids`` (rank -> pid), signalled and read back."""
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    raw, sizes, end = {}, {}, time.monotonic() + wait
    while len(raw) < len(pids) and time.monotonic() < end:
        time.sleep(0.02)
        for rank in set(pids) - set(raw):
            path = Path(stack_file(run_dir, rank))
            size = path.stat().st_size if path.exists() else 0
            if size and sizes.get(rank) == size:  # written and settled
                raw[rank] = path.read_text(errors="replace")
            sizes[rank] = size
    return {rank: format_stack(raw[rank]) if rank in raw else
            f"(no stack within {wait:g} s: the rank did not answer SIGUSR1)" for rank in pids}


_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')
_CELL = re.compile(r"ipykernel_\d+/\d+\.py$")  # where IPython keeps a cell's code


def format_stack(raw: str) -> str:
    """faulthandler's dump, the user's threads only, launcher frames cut, source lines added."""
    threads, out = raw.split("\n\n"), []
    for block in threads:
        frames = [m for m in map(_FRAME.match, block.splitlines()) if m]
        if not frames or any(m.group(3) == "_watch_lifeline" for m in frames):
            continue  # the launcher's lifeline thread
        lines = [block.strip().splitlines()[0]]  # "Thread 0x... (most recent call first):"
        for m in frames:
            path, number, func = m.group(1), int(m.group(2)), m.group(3)
            if os.path.dirname(os.path.abspath(path)) == _LAUNCHER:
                break  # the launcher's own frames below the user's function
            shown = path.split("site-packages/", 1)[-1]  # torch/..., the same on any machine
            shown = "<notebook cell>" if _CELL.search(shown) else shown
            lines.append(f'  File "{shown}", line {number}, in {func}')
            if source := linecache.getline(path, number).strip():
                lines.append(f"    {source}")
        out.append(lines)
    if len(out) == 1:  # the main thread alone: its header says nothing
        out[0] = out[0][1:]
    return "\n\n".join("\n".join(lines) for lines in out) or raw.strip()


def timeout_message(waiting: list[int], nprocs: int, timeout: float, stacks: dict) -> str:
    head = (f"rank(s) {waiting} of {nprocs} did not finish within {timeout:g} s; a collective "
            "may be waiting for a rank that never calls it (pass a larger timeout= if the work "
            "is just slow)")
    parts = [head] + [f"\n--- where rank {rank} was (Python stack, most recent call first) ---\n"
                      f"{stacks[rank]}" for rank in waiting if rank in stacks]
    return "\n".join(parts)


_PEER_GONE = re.compile(r"Connection (reset|closed) by peer|Broken pipe")


def culprit(state, ranks: list, sel, wait: float = PEER_WAIT_S):
    """The rank to blame: ``state``, unless its error says a peer went away and, within
    ``wait`` seconds, a peer is seen dead without answering (result pipe closed, no result) or
    failing for a reason of its own."""
    from course_lib.launcher._rank_pipes import open_pipes, pump_until
    outcome = state.outcome
    if not (outcome and outcome[0] == "error" and _PEER_GONE.search(outcome[2])):
        return state

    def dead() -> list:
        return [r for r in ranks if r is not state and (
            r.dump  # it has begun writing an abort dump: it is dying
            or (r.outcome is None and "result" not in open_pipes(sel, r))  # died without a word
            or (r.outcome and r.outcome[0] == "error" and not _PEER_GONE.search(r.outcome[2])))]
    pump_until(sel, dead, time.monotonic() + wait)
    return (dead() or [state])[0]


_GLOO_SIZE = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")
_DETAIL = re.compile(r"Detected mismatch between collectives on ranks\. Rank (\d+) is running "
                     r"collective: (CollectiveFingerPrint\(.*?\)), but Rank (\d+) is running "
                     r"collective: (CollectiveFingerPrint\(.*?\))\.?", re.S)


_CPU_OOM = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): "
                      r"you tried to allocate (\d+) bytes")
_CUDA_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)")


def _fingerprint(text: str) -> str:
    """``ALLREDUCE of shape [6] (Float)`` from a ``CollectiveFingerPrint(...)``."""
    op = re.search(r"OpType=(\w+)", text)
    shapes = re.findall(r"TensorShape=\[([^\]]*)\]", text)
    dtypes = re.findall(r"TensorDtypes=(\w+)", text)
    words = [op.group(1) if op else "a collective"]
    if shapes:
        words.append("of shape " + ", ".join(f"[{s}]" for s in shapes))
    if dtypes:
        words.append(f"({', '.join(dtypes)})")
    return " ".join(words)


def summary(rank: int, message: str, stderr: str) -> str | None:
    """One line naming the ranks and the mismatch, if ``message``/``stderr`` show one."""
    if found := _DETAIL.search(message) or _DETAIL.search(stderr):
        a, fa, b, fb = found.groups()
        if int(a) > int(b):  # in rank order, whichever rank reported it
            a, fa, b, fb = b, fb, a, fa
        return (f"collective mismatch (found by debug='detail'): rank {a} runs "
                f"{_fingerprint(fa)} while rank {b} runs {_fingerprint(fb)}")
    if found := _CPU_OOM.search(message) or _CPU_OOM.search(stderr):
        return (f"rank {rank} ran out of memory: the CPU allocator could not get "
                f"{int(found.group(1)) / 2**20:.2f} MiB more (what it held: chapter 01's tracker, "
                "chapter 10's BudgetTracker)")
    if found := _CUDA_OOM.search(message) or _CUDA_OOM.search(stderr):
        return f"rank {rank} ran out of GPU memory: it tried to allocate {found.group(1)} more"
    if found := _GLOO_SIZE.search(stderr) or _GLOO_SIZE.search(message):
        got, expected = found.groups()
        return (f"rank {rank} died in a collective: it received {got} bytes where {expected} "
                "were expected: the ranks disagree on a collective's sizes (shapes, dtypes or "
                "split sizes; run(..., debug='detail') compares shapes and dtypes, not splits)")
    return None
