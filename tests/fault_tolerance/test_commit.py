"""Chapter 6's commit protocol (``fault_tolerance/commit.py``) and its code exercise, on real ranks.

A crash injected between the shards and the marker must leave a ``.tmp`` directory that
``latest_committed`` skips and ``load_committed`` refuses; the exercise check must pass the
solution and fail the plausible mistakes with a message that says what is off.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from course_lib import RankError, run
from course_lib.common.data import get_batch
from course_lib.common.models import GPT
from course_lib.fault_tolerance.commit import (MARKER, latest_committed, load_committed,
                                               save_committed)
from course_lib.fault_tolerance.exercises import check_latest_committed
from course_lib.fault_tolerance.training import build


def _full(model) -> dict:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def _train_and_commit(root: str, steps: int, crash_in_save: int | None) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = build("tiny")
    for step in range(1, steps + 1):
        x, y = get_batch(2, 32, seed=0, step=step - 1, rank=rank, world_size=world)
        GPT.loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 2 == 0:
            die = None
            if (step, rank) == (crash_in_save, 1):
                die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
            save_committed(root, step, model, optimizer, before_commit=die)
    return _full(model)


def _load(path: str) -> dict:
    model, optimizer = build("tiny", seed=123)  # other initial weights: the load must replace them
    load_committed(path, model, optimizer)
    return _full(model)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """step_000002 and step_000004 committed; rank 1 killed in the save of step 6."""
    root = tmp_path_factory.mktemp("crash") / "ckpt"
    with pytest.raises(RankError, match="SIGKILL"):
        run(_train_and_commit, 2, str(root), 6, 6)
    return root


def test_a_crash_before_the_marker_leaves_an_uncommitted_tmp_that_is_skipped(crashed):
    names = sorted(p.name for p in crashed.iterdir())
    assert names == ["step_000002", "step_000004", "step_000006.tmp"]
    assert not (crashed / "step_000006.tmp" / MARKER).exists()
    assert (crashed / "step_000006.tmp" / ".metadata").exists(), "DCP's own part had finished"
    assert latest_committed(crashed) == crashed / "step_000004"
    assert latest_committed(crashed / "nowhere") is None


def test_load_committed_refuses_an_unfinished_save_and_restores_a_committed_one(crashed, tmp_path):
    with pytest.raises(RankError, match="step_000006.tmp has no commit marker"):
        run(_load, 2, str(crashed / "step_000006.tmp"))
    reference = run(_train_and_commit, 2, str(tmp_path / "clean"), 4, None)[0]
    for world in (2, 1):  # 2 ranks wrote it; 1 rank reads all of it (DCP reshards)
        loaded = run(_load, world, str(crashed / "step_000004"))[0]
        assert set(loaded) == set(reference)
        for name, value in reference.items():
            assert torch.equal(loaded[name], value), f"{name} at world {world}"


def _solution(root):
    steps = [int(p.name[5:]) for p in Path(root).glob("step_*")
             if p.name[5:].isdigit() and (p / MARKER).is_file()]
    return Path(root) / f"step_{max(steps):06d}" if steps else None


def _newest(root):
    return max(Path(root).glob("step_*"))


def _metadata_as_marker(root):
    done = [p for p in Path(root).glob("step_*") if (p / ".metadata").is_file()]
    return max(done, key=lambda p: int(p.name[5:11])) if done else None


def _first(root):
    done = sorted(p for p in Path(root).glob("step_*") if (p / MARKER).is_file())
    return done[0] if done else None


def test_the_exercise_passes_the_solution_and_fails_the_mistakes(crashed, no_leftover_ranks):
    passed, message = check_latest_committed(_solution, crashed)
    assert passed, message
    for wrong, words in ((_newest, "step_000006.tmp, which has no commit marker"),
                         (_metadata_as_marker, "step_000006.tmp, which has no commit marker"),
                         (_first, "a newer committed checkpoint exists"),
                         (lambda root: None, "found no checkpoint")):
        passed, message = check_latest_committed(wrong, crashed)
        assert not passed and words in message, message
        assert "step_000004" not in message, "the feedback must not name the answer"
    assert sorted(p.name for p in crashed.iterdir())[-1] == "step_000006.tmp", "root untouched"


def test_the_exercise_refuses_a_directory_that_tests_nothing(tmp_path):
    with pytest.raises(ValueError, match="not a crashed run's directory"):
        check_latest_committed(_solution, tmp_path)
    with pytest.raises(TypeError, match="no parentheses"):
        check_latest_committed(_solution(tmp_path), tmp_path)
