"""Chapter 06's commit timeline is drawn from the file operations the ranks really made: a run
that crashes in its second save and one that does not give different panels, and the recorded
order is the protocol's (tmp dir, shards, DCP metadata, marker, one rename) where it committed."""
from __future__ import annotations

import os
import signal

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
import torch.distributed as dist
from matplotlib.colors import to_rgba

from course_lib.display import OKABE_ITO

from course_lib.fault_tolerance.file_events import classify, traced_run
from course_lib.fault_tolerance.show import plot_commit_timeline
from figure_checks import too_small  # noqa: E402


def _train(root, steps=4, crash=None):
    """A Linear and its Adam, committed every 2 steps; rank 1 dies in save ``crash``."""
    from course_lib.fault_tolerance.commit import save_committed
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters())
    for step in range(1, steps + 1):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step % 2 == 0:
            die = None
            if (step, dist.get_rank()) == (crash, 1):
                die = lambda: os.kill(os.getpid(), signal.SIGKILL)
            save_committed(root, step, model, opt, before_commit=die)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {crash: traced_run(_train, 2, tmp_path_factory.mktemp(f"c{crash}"), crash=crash)
            for crash in (None, 4)}


def _first(kinds, kind):
    return kinds.index(kind)


def test_recorded_order_is_the_commit_protocol(runs):
    clean, crashed = runs[None], runs[4]
    assert clean["error"] is None and "SIGKILL" in crashed["error"]
    for save in ("step_000002", "step_000004"):
        kinds = [classify(e) for e in clean["events"] if save in e["path"]]
        assert _first(kinds, "tmp dir") < _first(kinds, "shard") < _first(kinds, "metadata") \
            < _first(kinds, "marker") < _first(kinds, "commit rename") == len(kinds) - 1
    last = [classify(e) for e in crashed["events"] if "step_000004" in e["path"]]
    assert "shard" in last and "marker" not in last and "commit rename" not in last
    assert [e["rank"] for e in crashed["events"] if e["kind"] == "kill"] == [1]


def test_timeline_has_a_panel_per_save_and_the_crash_where_it_happened(runs):
    for crash, run in runs.items():
        fig = plot_commit_timeline(run["events"])
        assert not too_small(fig)
        titles = [ax.get_title() for ax in fig.axes]
        assert len(titles) == 2
        assert ["NOT committed" in t for t in titles] == [False, crash is not None]
        points = [(ax, c.get_offsets()[0]) for ax in fig.axes for c in ax.collections]
        n_events = sum(classify(e) != "other" for e in run["events"])
        assert len(points) == n_events
        crashes = [(i, tuple(c.get_offsets()[0])) for i, ax in enumerate(fig.axes)
                   for c in ax.collections if tuple(c.get_facecolor()[0]) == to_rgba(OKABE_ITO[5])]
        # the SIGKILL: in the second save, on rank 1, as that save's last operation
        assert crashes == ([] if crash is None else [(1, (len(fig.axes[1].collections), 1.0))])
