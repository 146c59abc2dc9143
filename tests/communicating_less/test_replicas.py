"""Chapter 11's replica failure with torchft: replica 1 is SIGKILLed mid-run and started again;
replica 0 commits every step without a gap, and the newcomer ends on its peer's weights (it
started from different ones: only the fetch from its live peer makes them equal)."""
from __future__ import annotations

import pytest

from course_lib.communicating_less.replicas import summarize, survive_a_failure

pytest.importorskip("torchft")
STEPS, KILL_AT = 16, 4


@pytest.fixture(scope="module")
def lines():
    return survive_a_failure(steps=STEPS, kill_at=KILL_AT, step_s=0.05)


def test_the_survivor_counts_every_step(lines):
    s = summarize(lines)
    assert s["committed"] == list(range(s["first"], s["final"] + 1)) and s["first"] <= KILL_AT
    assert s["final"] >= STEPS and s["alone"] >= 1 and s["redone"] <= 2


def test_the_rejoined_replica_equals_its_peer(lines):
    s = summarize(lines)
    assert s["rejoined_at"] is not None and s["rejoined_at"] > KILL_AT
    assert s["equal"]
    ends = {l["replica"]: l["loss"] for l in lines if "done" in l}
    assert ends[0] == ends[1]


@pytest.mark.parametrize("kwargs, message", [({"steps": 4, "kill_at": 4}, "kill_at"),
                                             ({"step_s": -1}, "step_s"),
                                             ({"steps": 0}, "steps")])
def test_bad_requests_fail_early(kwargs, message):
    with pytest.raises(ValueError, match=message):
        survive_a_failure(**kwargs)


def test_restart_everything_loses_the_steps_since_the_last_checkpoint():
    from course_lib.communicating_less.restart import restart_everything
    row = restart_everything(steps=8, kill_at=7, every=4)
    assert row["resumed_from"] == 4 and row["lost_steps"] == 3


def test_the_job_runs_with_the_warm_server_paused(monkeypatch):
    """Issue 50: the torchft job's zygote imports torch itself; the kernel's idle warm server is
    ended meanwhile (where the pod is small) rather than kept beside the replicas."""
    import subprocess

    from course_lib.communicating_less import replicas
    from test_slow_link import recording_pause
    seen, paused = [], []

    def fake_run(argv, **kwargs):
        seen.append(bool(paused))
        done = ('{"replica": 0, "done": true}\n{"replica": 1, "done": true}\n')
        return subprocess.CompletedProcess(argv, 0, stdout=done.encode(), stderr=b"")

    monkeypatch.setattr(replicas, "server_paused", recording_pause(paused))
    monkeypatch.setattr(replicas.subprocess, "run", fake_run)
    assert len(survive_a_failure(steps=3, kill_at=1)) == 2
    assert seen == [True] and not paused


def test_the_loop_is_the_callers_and_a_broken_one_is_seen():
    """``train=`` travels to the job by value: a loop without torchft's Manager runs there, and
    its replicas end on different weights (the test above sees them equal)."""
    def no_recovery(replica_id, lighthouse, store_port, steps, log):
        """The chapter's loop with a mistake: a plain optimizer, no Manager: nothing is averaged."""
        import torch
        import torch.nn.functional as F
        from torch import nn
        from course_lib.communicating_less.task import task_batch
        torch.manual_seed(replica_id)
        model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 16))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(1, steps + 1):
            opt.zero_grad()
            x, y = task_batch(step, replica_id)
            F.mse_loss(model(x), y).backward()
            opt.step()
            log(step, 1, model)  # alone: the job restarts the killed replica after such a step
        return model

    lines = survive_a_failure(steps=6, kill_at=1, step_s=0.2, train=no_recovery, timeout=60)
    ends = {l["replica"]: l["loss"] for l in lines if "done" in l}
    assert len(ends) == 2 and ends[0] != ends[1]
    with pytest.raises(TypeError, match="train must be a function"):
        survive_a_failure(train="train_replica")


def test_a_job_past_its_bound_ends_with_a_clear_error(monkeypatch):
    """Issue 57: the cell ends within the job's timeout + 30 s with a TimeoutError naming the
    bound and the last step seen, not subprocess's TimeoutExpired quoting a command line."""
    import subprocess

    from course_lib.communicating_less import replicas

    def stuck(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"],
                                        output=b'{"begin": 1}\n{"replica": 0, "step": 4}\n')

    monkeypatch.setattr(replicas.subprocess, "run", stuck)
    with pytest.raises(TimeoutError, match=r"^the torchft job did not end within 40 s \(its 10 s "
                       r"and 30 s to start and clean up\); it was killed, and its replicas with "
                       r"it \(last line: \{\"replica\": 0, \"step\": 4\}\)$"):
        survive_a_failure(steps=3, kill_at=1, timeout=10)
