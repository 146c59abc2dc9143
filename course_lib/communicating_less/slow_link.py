"""Chapter 11's runs over a slow link: ``run``'s ranks inside a private network namespace whose
loopback is shaped with ``tc`` (a token bucket, as chapter 5's link sweep shapes its veth pair).

:func:`over_slow_link` starts ``python -m course_lib.communicating_less.slow_link``; that child
enters fresh network and mount namespaces (:func:`course_lib.launcher._private_net.enter`, before
it imports torch), sets its loopback to the shaped veth's jumbo-frame MTU (``netns.MTU``: the
bucket's burst holds a packet, and per-packet work stays small), and per rate shapes it
(:func:`course_lib.launcher.netns.shape`) and calls one of this chapter's measurements, whose
ranks (and their gloo sockets on 127.0.0.1) live inside, forked from the child itself
(``launch.serve_from_here``: torch is imported once, not twice). Nothing outside sees the
shaping; the namespace ends with the child. One JSON line per rate.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from typing import Sequence

from course_lib.communication.link_sweep import LinkSweepUnavailable

JOBS = {"hooks": "course_lib.communicating_less.measure:compare_hooks",
        "local_sgd": "course_lib.communicating_less.measure:compare_local_sgd",
        "both": "course_lib.communicating_less.measure:hooks_and_local_sgd"}


def over_slow_link(job: str, rates_mbit: Sequence[float], timeout: float = 180.0,
                   **kwargs) -> list[dict]:
    """Run measurement ``job`` (a key of ``JOBS``) once per rate (Mbit/s; 0 = unshaped).

    Returns one dict per rate: ``rate_mbit`` and ``rows`` (the measurement's return value).
    Raises :class:`LinkSweepUnavailable` where no namespace can be made, ``RuntimeError`` with
    the child's last lines when it fails.
    """
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; choose one of {', '.join(JOBS)}")
    rates = list(rates_mbit)
    if not rates or any(not isinstance(r, (int, float)) or r < 0 for r in rates):
        raise ValueError(f"rates_mbit must be numbers >= 0 (0: unshaped), got {rates_mbit!r}")
    request = json.dumps({"job": job, "rates": rates, "kwargs": kwargs})
    done = subprocess.run([sys.executable, "-m", "course_lib.communicating_less.slow_link"],
                          input=request, capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    refused = next((line["refused"] for line in lines if "refused" in line), None)
    if refused:
        raise LinkSweepUnavailable(refused)
    if done.returncode != 0 or len(lines) != len(rates):
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise RuntimeError(f"the slow-link child failed (exit {done.returncode}):\n{tail}")
    return lines


def _main() -> None:
    from course_lib.launcher import _private_net
    request = json.loads(sys.stdin.readline())
    try:
        _private_net.enter()
    except _private_net.Refused as exc:
        print(json.dumps({"refused": f"no private network namespace: {exc}"}), flush=True)
        return
    from course_lib.launcher.netns import MTU, shape
    subprocess.run(["ip", "link", "set", "lo", "mtu", str(MTU)], check=True)
    module, _, name = JOBS[request["job"]].partition(":")
    measure = getattr(importlib.import_module(module), name)
    from course_lib.launcher.launch import serve_from_here
    for preload in ("torch.nn.parallel", "torch._dynamo", "course_lib.launcher._worker"):
        importlib.import_module(preload)  # what DDP's ranks would import each
    serve_from_here()  # ranks forked from this process: no second interpreter imports torch
    for rate in request["rates"]:
        shape(os.getpid(), "lo", rate, 0)
        rows = measure(**request["kwargs"])
        print(json.dumps({"rate_mbit": rate, "rows": rows}), flush=True)


if __name__ == "__main__":
    _main()
