"""Chapter 6: one bad folder never blocks a resume, a save never writes outside its root, and a
failed load leaves the model and optimizer exactly as they were (issue 29).

Exploits as tests: a newer checkpoint with a malformed manifest must be skipped with a logged
reason; a planted ``latest.tmp`` link must not redirect a save into its target (a victim file
that must stay unchanged); a load that fails half-way must leave a model equal to its clone, in
this process and on 2 FSDP2 ranks.
"""
from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor

from ckpt_attacks import point_item, write_manifest
from course_lib import run
from course_lib.common.data import get_batch
from course_lib.common.models import GPT
from course_lib.fault_tolerance.checkpoint import (CheckpointError, checkpoint_status,
                                                   latest_checkpoint, load_checkpoint,
                                                   save_checkpoint)
from course_lib.fault_tolerance.training import build, train

NESTED = "[" * 100_000 + "]" * 100_000


def _newer(ckpt, edit):
    """A copy of ``ckpt`` as step 4 next to it, its manifest changed by ``edit``."""
    newer = ckpt.parent / "step_000004"
    shutil.copytree(ckpt, newer)
    write_manifest(newer, lambda m: edit({**m, "step": 4}))
    return newer


@pytest.mark.parametrize("edit, reason", [
    (lambda m: {**m, "files": []}, "files is not a non-empty object"),
    (lambda m: {**m, "files": {k: {"sha256": v["sha256"]} for k, v in m["files"].items()}},
     "an entry of files has no integer bytes"),
    (lambda m: {**m, "files": {k: "x" for k in m["files"]}}, "an entry of files is not an object"),
    (lambda m: f'{{"format": "{m["format"]}", "step": 4, "meta": {NESTED}}}',
     "malformed manifest: nested too deeply"),
    (lambda m: {**m, "model_shapes": "everything"}, "model_shapes is not an object"),
    (lambda m: {**m, "files": {"../x": {"bytes": 1, "sha256": "0" * 64}}},
     "files names something that is not a plain file name"),
])
def test_a_malformed_manifest_is_skipped_with_a_logged_reason(ckpt, caplog, edit, reason):
    _newer(ckpt, edit)
    with caplog.at_level(logging.WARNING, logger="course_lib.fault_tolerance"):
        assert latest_checkpoint(ckpt.parent) == ckpt
    assert any("step_000004" in r.getMessage() and reason in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert dict(checkpoint_status(ckpt.parent))["step_000004"].startswith("skipped: malformed")


def _flip_a_byte(newer):
    data = bytearray((newer / "__0_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0xFF  # the size still matches: only loading sees it
    (newer / "__0_0.distcp").write_bytes(bytes(data))


@pytest.mark.parametrize("spoil, reason", [
    (_flip_a_byte, "checksum mismatch in __0_0.distcp"),
    (lambda newer: write_manifest(newer, lambda m: {**m, "meta": {"seed": 0}}),
     "meta has no loss history of 4 numbers"),
])
def test_train_resumes_from_the_newest_checkpoint_that_loads(ckpt, caplog, spoil, reason):
    spoil(_newer(ckpt, lambda m: {**m, "meta": {**m["meta"], "losses": [1.0] * 4}}))
    with caplog.at_level(logging.WARNING, logger="course_lib.fault_tolerance"):
        result = train("tiny", 4, ckpt_dir=ckpt.parent, every=2, keep=None)
    assert result["resumed_from"] == 2
    assert any("step_000004" in r.getMessage() and reason in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("planted", ["latest.tmp", "step_000002.tmp"])
def test_a_planted_link_never_redirects_a_save(tmp_path, planted):
    root, victim, victim_dir = tmp_path / "root", tmp_path / "victim.txt", tmp_path / "victim"
    root.mkdir()
    victim_dir.mkdir()
    victim.write_text("precious\n")
    # pre-created by someone who could write to the root once (a file, or a directory)
    (root / planted).symlink_to(victim if planted == "latest.tmp" else victim_dir)
    model, optimizer = build("tiny")
    save_checkpoint(root, 2, model, optimizer)
    assert victim.read_text() == "precious\n", "the save wrote through the planted link"
    assert not any(victim_dir.iterdir()), "the save wrote into the planted directory"
    assert (root / "latest").read_text() == "step_000002\n"
    assert latest_checkpoint(root) == root / "step_000002"


def test_a_root_that_other_users_can_write_is_refused(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    model, optimizer = build("tiny")
    with pytest.raises(CheckpointError, match="shared: other users can write to this folder"):
        save_checkpoint(root, 2, model, optimizer)
    assert not any(root.iterdir())
    if os.geteuid() == 0:  # CI runs as root: a folder another user made (``nobody``)
        root.chmod(0o755)
        os.chown(root, 65534, 65534)
        with pytest.raises(CheckpointError, match="shared: owned by another user"):
            save_checkpoint(root, 2, model, optimizer)


def _copy(value):
    """A copy of this rank's part of ``value``, never a view (a load writes into live tensors)."""
    return (value.to_local() if isinstance(value, DTensor) else value).detach().clone()


def _states(model, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer)  # this rank's shards, by name
    return {"model": {k: _copy(v) for k, v in model_sd.items()},
            "state": {k: {n: _copy(v) for n, v in s.items()}
                      for k, s in optim_sd["state"].items()},
            "groups": [{k: v for k, v in g.items() if k != "params"}
                       for g in optim_sd["param_groups"]]}


def _one_step(model, optimizer, rank=0, world=1):
    x, y = get_batch(2, 32, seed=5, step=0, rank=rank, world_size=world)
    GPT.loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _failed_load_changes(path) -> list[str]:
    """Rank function: what a load that fails half-way changed (``[]``: nothing)."""
    import torch.distributed as dist
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    changed = []
    fresh_model, fresh_optimizer = build("tiny", seed=3)
    model, optimizer = build("tiny", seed=3)
    _one_step(model, optimizer, rank, world)
    clone = _states(model, optimizer)
    for m, o in ((fresh_model, fresh_optimizer), (model, optimizer)):
        try:
            load_checkpoint(path, m, o)
            changed.append("the load did not fail")
        except BaseException as exc:  # noqa: B036 - DCP's CheckpointException is one
            if not isinstance(exc, CheckpointError):
                changed.append(f"raised {type(exc).__name__}, not CheckpointError")
    if fresh_optimizer.state:
        changed.append("the fresh optimizer got a state")
    after = _states(model, optimizer)
    for part in ("model", "state"):
        for key, value in clone[part].items():
            same = (torch.equal(value, after[part][key]) if part == "model" else
                    all(torch.equal(v, after[part][key][n]) for n, v in value.items()))
            if not same:
                changed.append(f"{part} {key}")
    if after["groups"] != clone["groups"]:
        changed.append("param_groups")
    return changed


def test_a_failed_load_leaves_model_and_optimizer_exactly_as_they_were(ckpt, no_leftover_ranks):
    # the last item read (a bytes item after every tensor) is garbage inside the shard file
    point_item(ckpt, "optim.param_groups.0.lr", offset=0, length=10)
    assert _failed_load_changes(ckpt) == []
    assert run(_failed_load_changes, 2, ckpt) == [[], []]  # FSDP2 shards: DTensors
