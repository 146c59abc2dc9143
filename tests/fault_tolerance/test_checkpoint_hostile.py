"""Issue 49: folders that do not verify never cost a good checkpoint, a ``.metadata`` cannot ask
for unbounded work, and a folder swapped during a load cannot redirect it.

Each test was seen failing on the code before issue 49: the pruning test left
``['latest', 'step_000900', 'step_000901']``; the chunk-multiplied ``.metadata`` (one tensor's
chunk list repeated 10^6 times through the pickle's memo, manifest resealed) loaded in minutes;
the swap loop loaded the other checkpoint's weights in some of its loads.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch

from ckpt_attacks import peak_rss_growth, tamper
from course_lib.fault_tolerance.checkpoint import (CheckpointError, latest_checkpoint,
                                                   load_checkpoint, save_checkpoint)
from course_lib.fault_tolerance.training import build

EMB = "model.tok_emb.weight"
MiB = 1 << 20


def _plant_invalid(root):
    """Newer-numbered folders that are no checkpoint: empty, and a malformed manifest."""
    (root / "step_000900").mkdir()
    (root / "step_000901").mkdir()
    bad = root / "step_000902"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({"format": "course_lib.checkpoint/1",
                                                   "step": 902, "files": []}))
    return {"step_000900", "step_000901", "step_000902"}


@pytest.mark.parametrize("keep", [1, 2])
def test_invalid_newer_folders_never_prune_a_good_checkpoint(ckpt, keep):
    root = ckpt.parent
    planted = _plant_invalid(root)
    model, optimizer = build("tiny")
    save_checkpoint(root, 4, model, optimizer, keep=keep)
    left = {p.name for p in root.iterdir()}
    good = {"step_000004", "step_000002"} if keep == 2 else {"step_000004"}
    assert left == good | planted | {"latest"}, sorted(left)
    assert latest_checkpoint(root) == root / "step_000004"


def test_pruning_keeps_the_newest_good_ones_and_the_one_just_saved(ckpt):
    root = ckpt.parent
    model, optimizer = build("tiny")
    for step in (4, 6):
        save_checkpoint(root, step, model, optimizer, keep=None)
    save_checkpoint(root, 3, model, optimizer, keep=2)  # a lower step saved last (a new run)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000003", "step_000006"]


def _metadata(ckpt):
    return pickle.loads((ckpt / ".metadata").read_bytes())  # our own file: plain pickle


def _chunks_repeated(ckpt, times: int) -> int:
    md = _metadata(ckpt)
    item = md.state_dict_metadata[EMB]
    item.chunks = item.chunks * times  # the same objects: the pickle's memo stores them once
    data = pickle.dumps(md)
    tamper(ckpt, ".metadata", data)
    return len(data)


def test_a_chunk_multiplied_metadata_is_refused_fast_with_flat_memory(ckpt):
    size = _chunks_repeated(ckpt, 10**6)
    assert size < 16 * MiB  # under the size limit: only the work bound can refuse it
    model, optimizer = build("tiny")
    before = model.tok_emb.weight.detach().clone()
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=r"step_000002: refusing to load: \.metadata holds "
                                              r"a list of more than 4096 items") as err:
        load_checkpoint(ckpt, model, optimizer)
    took = time.monotonic() - started
    assert took < 1.0, f"refused after {took:.1f} s"  # 201 s and 940 MB before issue 49
    grew = peak_rss_growth(lambda: load_checkpoint(ckpt, *build("tiny")))
    assert grew is None or grew < 48 * MiB, f"+{grew / MiB:.0f} MiB"
    assert torch.equal(model.tok_emb.weight, before), err.value


def test_a_chunk_listed_twice_is_refused(ckpt):
    _chunks_repeated(ckpt, 2)
    model, optimizer = build("tiny")
    with pytest.raises(CheckpointError, match=r"entry model\.tok_emb\.weight: chunks that "
                                              r"overlap"):
        load_checkpoint(ckpt, model, optimizer)


def test_two_items_sharing_bytes_are_refused(ckpt):
    md = _metadata(ckpt)
    infos = [info for index, info in md.storage_data.items() if index.fqn != EMB]
    emb = next(info for index, info in md.storage_data.items() if index.fqn == EMB)
    emb.offset, emb.length = infos[0].offset, infos[0].length  # read another item's record
    tamper(ckpt, ".metadata", pickle.dumps(md))
    model, optimizer = build("tiny")
    with pytest.raises(CheckpointError, match=r"two items share bytes of __0_0\.distcp"):
        load_checkpoint(ckpt, model, optimizer)


_SWAPPER = """
import os, sys, time
folder, aside, other, stop = sys.argv[1:]
while not os.path.exists(stop):
    os.rename(folder, aside)
    os.symlink(other, folder)
    time.sleep(0.0005)
    os.unlink(folder)
    os.rename(aside, folder)
    time.sleep(0.0005)
"""


def test_a_folder_swapped_during_loads_loads_the_original_or_refuses(ckpt, tmp_path):
    other_root = tmp_path / "other"
    model, optimizer = build("tiny")
    load_checkpoint(ckpt, model, optimizer)
    original = model.tok_emb.weight.detach().clone()
    with torch.no_grad():
        model.tok_emb.weight.add_(1.0)  # another checkpoint under the same name and step
    save_checkpoint(other_root, 2, model, optimizer, keep=None)
    stop = tmp_path / "stop"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(ckpt),
                                str(tmp_path / "aside"), str(other_root / ckpt.name), str(stop)])
    loaded = refused = 0
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and loaded + refused < 150:
            model, optimizer = build("tiny")
            try:
                load_checkpoint(ckpt, model, optimizer, checksums=False)
            except CheckpointError:
                refused += 1
                continue
            loaded += 1
            assert torch.equal(model.tok_emb.weight, original), \
                f"load {loaded + refused} read the other checkpoint through the swapped folder"
    finally:
        stop.touch()
        swapper.wait(timeout=10)
    print(f"swap loop: {loaded} loaded the original, {refused} refused")
    assert loaded > 0 and refused > 0, (loaded, refused)  # both sides of the race were seen
    assert os.path.isdir(ckpt) and not os.path.islink(ckpt)
