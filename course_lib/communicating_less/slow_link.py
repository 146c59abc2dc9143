"""Chapter 11's runs over a slow link: ``run``'s ranks inside a private network namespace whose
loopback is shaped with ``tc`` (a token bucket, as chapter 5's link sweep shapes its veth pair).

:func:`over_slow_link` hands one of this chapter's measurements to
:func:`course_lib.launcher.shaped_link.run_on_loopback`: the course's one hub for shaped links
enters fresh network and mount namespaces (before it imports torch), gives its loopback the
shaped veth's jumbo-frame MTU (the bucket's burst holds a packet, and per-packet work stays
small) and, per rate, shapes it and calls the measurement, whose ranks (and their gloo sockets
on 127.0.0.1) live inside, forked from the hub itself (torch is imported once, not twice).
Nothing outside sees the shaping; the namespace ends with the hub. One dict per rate.
"""
from __future__ import annotations

import importlib
from typing import Sequence

from course_lib.communication.link_sweep import LinkSweepUnavailable  # noqa: F401 - raised here
from course_lib.launcher.shaped_link import run_on_loopback

JOBS = {"hooks": "course_lib.communicating_less.measure:compare_hooks",
        "local_sgd": "course_lib.communicating_less.measure:compare_local_sgd",
        "both": "course_lib.communicating_less.measure:hooks_and_local_sgd"}
#: What DDP's ranks would each import: the hub imports it once, before it forks them.
PRELOAD = ("course_lib.communicating_less.measure", "torch.nn.parallel", "torch._dynamo",
           "course_lib.launcher._worker")


def over_slow_link(job: str, rates_mbit: Sequence[float], timeout: float = 180.0,
                   **kwargs) -> list[dict]:
    """Run measurement ``job`` (a key of ``JOBS``) once per rate (Mbit/s; 0 = unshaped).

    Returns one dict per rate: ``rate_mbit`` and ``rows`` (the measurement's return value).
    Raises :class:`LinkSweepUnavailable` where no namespace can be made, ``RuntimeError`` with
    the hub's last lines when it fails.
    """
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; choose one of {', '.join(JOBS)}")
    rates = list(rates_mbit)
    if not rates or any(not isinstance(r, (int, float)) or r < 0 for r in rates):
        raise ValueError(f"rates_mbit must be numbers >= 0 (0: unshaped), got {rates_mbit!r}")
    results = run_on_loopback("course_lib.communicating_less.slow_link:measure",
                              [(rate, {"job": job, **kwargs}) for rate in rates],
                              preload=PRELOAD, timeout=timeout, what="the slow-link run")
    return [{"rate_mbit": rate, "rows": rows} for rate, rows in zip(rates, results)]


def measure(job: str, cache: dict, **kwargs):
    """The hub's target: measurement ``job`` with ``kwargs``, on the link as shaped now."""
    module, _, name = JOBS[job].partition(":")
    return getattr(importlib.import_module(module), name)(**kwargs)
