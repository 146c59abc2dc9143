"""Chapter 11's slow link: bad requests fail before any process starts."""
from __future__ import annotations

import contextlib

import pytest

from course_lib.communicating_less.slow_link import over_slow_link
from course_lib.launcher import shaped_link


@pytest.mark.parametrize("job, rates, message", [("nope", [0], "unknown job"),
                                                 ("hooks", [], "rates_mbit"),
                                                 ("hooks", [-1], "rates_mbit")])
def test_bad_requests_fail_early(job, rates, message):
    with pytest.raises(ValueError, match=message):
        over_slow_link(job, rates)


def recording_pause(paused: list):
    """A stand-in for ``launch.server_paused`` that keeps ``[True]`` in ``paused`` while open."""
    @contextlib.contextmanager
    def pause():
        paused.append(True)
        try:
            yield
        finally:
            paused.pop()
    return pause


def test_the_hub_runs_with_the_warm_server_paused(monkeypatch):
    """Issue 50: the hub (and run_pair's nodes) import torch themselves; the kernel's idle warm
    server is ended meanwhile (where the pod is small) rather than kept beside them."""
    seen, paused = [], []

    def hub(opts, timeout, what):
        seen.append(bool(paused))
        return [{"job": i, "ranks": [{"rate": rate}]} for i, (rate, _, _) in
                enumerate(opts["jobs"])]

    monkeypatch.setattr(shaped_link, "server_paused", recording_pause(paused))
    monkeypatch.setattr(shaped_link, "_hub", hub)
    links = over_slow_link("hooks", [0, 50], hook_steps=3)
    assert links == [{"rate_mbit": 0, "rows": {"rate": 0.0}},
                     {"rate_mbit": 50, "rows": {"rate": 50.0}}]
    shaped_link.run_pair("course_lib.communication.scaling_link:scaling_rank", [(0, {})],
                         mode="root")
    assert seen == [True, True] and not paused
