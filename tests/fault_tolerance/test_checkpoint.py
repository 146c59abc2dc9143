"""Chapter 6: sharded checkpoints are complete or ignored, and resuming loses nothing.

Runs go through ``course_lib.run`` (2 ranks, FSDP2 tiny GPT, gloo on CPU). "Nothing lost" is
asserted bit for bit (``torch.equal`` and ``==`` on the float losses): the resumed run performs
exactly the same float operations in the same order (same world size, 1 thread per rank, batches
a pure function of (seed, step, rank), Adam state restored exactly), so no tolerance is needed.
Resharding (2 ranks save, 4 or 1 load) restores states exactly; the next step sums gradients in
another order, so it is compared with ``assert_close``. Tampered checkpoints must not run code.
"""
from __future__ import annotations

import io
import json
import pickle
import random
import shutil

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from course_lib import RankError, run
from course_lib.fault_tolerance.checkpoint import (CheckpointError, checkpoint_name,
                                                   checkpoint_status, latest_checkpoint,
                                                   load_checkpoint, verify_checkpoint)
from course_lib.fault_tolerance.safe_files import load_plain
from course_lib.deepspeed.holdings import split_key_bias
from course_lib.fault_tolerance.training import Fault, build, train
from course_lib.common.models import get_config, param_count
from ckpt_attacks import tamper, torch_bytes

STEPS, EVERY = 6, 2


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted run: no checkpoints, no faults."""
    return run(train, 2, "tiny", STEPS, every=0)[0]


@pytest.fixture(scope="module")
def good_ckpt(tmp_path_factory):
    """A committed 2-rank checkpoint of the tiny GPT after 2 steps."""
    root = tmp_path_factory.mktemp("good")
    run(train, 2, "tiny", 2, ckpt_dir=root, every=2)
    return root / "step_000002"


def assert_same_run(got: dict, ref: dict) -> None:
    assert got["losses"] == ref["losses"], "loss curves differ"
    assert set(got["params"]) == set(ref["params"])
    for name, value in ref["params"].items():
        assert torch.equal(got["params"][name], value), f"{name} differs"


def test_resume_after_fault_at_random_step_equals_uninterrupted(tmp_path, reference,
                                                                no_leftover_ranks):
    rng = random.Random()
    kind, step, rank = rng.choice(["kill", "raise"]), rng.randrange(EVERY, STEPS), rng.randrange(2)
    why = "SIGKILL" if kind == "kill" else f"injected fault: rank {rank} raised at step {step}"
    with pytest.raises(RankError, match=why) as err:
        run(train, 2, "tiny", STEPS, ckpt_dir=tmp_path, every=EVERY,
            faults=[Fault(0, rank, step, kind)])
    assert err.value.rank == rank, f"{kind} on rank {rank} at step {step}"
    resumed = run(train, 2, "tiny", STEPS, ckpt_dir=tmp_path, every=EVERY, attempt=1)[0]
    assert resumed["resumed_from"] == step // EVERY * EVERY, f"{kind} at step {step}"
    assert_same_run(resumed, reference)


def test_crash_during_save_keeps_previous_checkpoint(tmp_path, reference, no_leftover_ranks):
    with pytest.raises(RankError, match="SIGKILL"):
        run(train, 2, "tiny", STEPS, ckpt_dir=tmp_path, every=EVERY, faults=[Fault(0, 1, 4, "save")])
    status = dict(checkpoint_status(tmp_path))
    assert status["step_000002"] == "complete"
    assert status["step_000004.tmp"].startswith("skipped")
    assert any(p.name.endswith(".distcp") for p in (tmp_path / "step_000004.tmp").iterdir()), \
        "the shards were written: only the commit marker is missing"
    assert latest_checkpoint(tmp_path).name == "step_000002"
    assert (tmp_path / "latest").read_text().strip() == "step_000002"
    resumed = run(train, 2, "tiny", STEPS, ckpt_dir=tmp_path, every=EVERY, attempt=1)[0]
    assert resumed["resumed_from"] == 2
    assert_same_run(resumed, reference)
    assert not list(tmp_path.glob("*.tmp")), "the stale .tmp directory is cleaned up"


def test_latest_ignores_unmarked_and_broken_directories(tmp_path, good_ckpt):
    shutil.copytree(good_ckpt, tmp_path / "step_000002")
    shutil.copytree(good_ckpt, tmp_path / "step_000008")
    (tmp_path / "step_000008" / "manifest.json").unlink()  # no commit marker
    shutil.copytree(good_ckpt, tmp_path / "step_000006")
    next((tmp_path / "step_000006").glob("__1_*.distcp")).unlink()  # a missing shard
    (tmp_path / "step_000009.tmp").mkdir()
    assert latest_checkpoint(tmp_path).name == "step_000002"
    assert latest_checkpoint(tmp_path / "nowhere") is None


def _corrupt_copy(src, dst, how: str):
    shutil.copytree(src, dst)
    shard = next(dst.glob("__0_*.distcp"))
    manifest = dst / "manifest.json"
    if how == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif how == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif how == "missing":
        shard.unlink()
    elif how == "no-marker":
        manifest.unlink()
    elif how in ("step", "format", "garbage"):
        m = json.loads(manifest.read_text())
        m.update(step=7) if how == "step" else m.update(format="someone-else/3")
        manifest.write_text("{not json" if how == "garbage" else json.dumps(m))
    elif how == "extra":
        (dst / "__9_0.distcp").write_bytes(b"x")
    return dst


@pytest.mark.parametrize("how, message", [
    ("flip", "checksum mismatch in __0_0.distcp"),
    ("truncate", r"__0_0.distcp has \d+ bytes, the manifest says \d+"),
    ("missing", "missing file __0_0.distcp"),
    ("no-marker", "no manifest.json .commit marker."),
    ("step", "manifest mismatch: it says step 7"),
    ("format", "foreign checkpoint: manifest format 'someone-else/3'"),
    ("garbage", "manifest.json is not valid JSON"),
    ("extra", r"files not in the manifest \['__9_0.distcp'\]"),
])
def test_corrupted_checkpoint_gives_clear_error(tmp_path, good_ckpt, how, message):
    broken = _corrupt_copy(good_ckpt, tmp_path / "step_000002", how)
    model, optimizer = build("tiny")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(broken, model, optimizer)


def test_unfinished_checkpoint_is_refused(tmp_path, good_ckpt):
    shutil.copytree(good_ckpt, tmp_path / "step_000002.tmp")
    with pytest.raises(CheckpointError, match="not a committed checkpoint"):
        verify_checkpoint(tmp_path / "step_000002.tmp")
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        checkpoint_name(-1)


class _Payload:
    """Unpickles by running code (creates ``marker``), then returns the real metadata."""

    def __init__(self, marker, original: bytes):
        self.marker, self.original = str(marker), original

    def __reduce__(self):
        return eval, (f"(open({self.marker!r}, 'w').close(), "
                      f"__import__('pickle').loads({self.original!r}))[1]",)


def test_tampered_metadata_is_refused_without_running_its_code(tmp_path, good_ckpt):
    ckpt = tmp_path / "step_000002"
    shutil.copytree(good_ckpt, ckpt)
    marker = tmp_path / "code_ran"
    tamper(ckpt, ".metadata", pickle.dumps(_Payload(marker, (ckpt / ".metadata").read_bytes())))
    # control: torch's own reader runs the payload and still returns valid metadata
    assert isinstance(FileSystemReader(str(ckpt)).read_metadata(), Metadata)
    assert marker.exists(), "the payload is live: the refusal below is meaningful"
    marker.unlink()
    model, optimizer = build("tiny")
    with pytest.raises(CheckpointError, match=r"step_000002: refusing to load: .metadata asks "
                                              r"for builtins.eval"):
        load_checkpoint(ckpt, model, optimizer)
    assert not marker.exists(), "code from the checkpoint ran"


def test_garbage_metadata_gives_clear_error(tmp_path, good_ckpt):
    ckpt = tmp_path / "step_000002"
    shutil.copytree(good_ckpt, ckpt)
    tamper(ckpt, ".metadata", b"\x80\x05garbage")
    model, optimizer = build("tiny")
    with pytest.raises(CheckpointError, match=r"step_000002: unreadable .metadata"):
        load_checkpoint(ckpt, model, optimizer)


def test_non_tensor_items_load_without_code(tmp_path):
    marker, buf = tmp_path / "code_ran", io.BytesIO()
    torch.save(_Payload(marker, pickle.dumps([1, 2])), buf)
    with pytest.raises(pickle.UnpicklingError, match="item x: a bytes item holds something "
                                                     "other than plain data"):
        load_plain(buf.getvalue(), "item x")
    assert not marker.exists()
    assert load_plain(torch_bytes({"lr": 0.5, "betas": (0.9, 0.99)}), "item y") == \
        {"lr": 0.5, "betas": (0.9, 0.99)}


def _loaded(path):
    """Rank function: load ``path`` into a fresh model; full states on rank 0 (CPU)."""
    model, optimizer = build("tiny")
    info = load_checkpoint(path, model, optimizer)
    sd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                        cpu_offload=True))
    return {"info": {k: info[k] for k in ("step", "saved_world", "rng")}, "model": sd,
            "optim": osd}


def test_reshard_save_at_2_load_at_4_and_1_and_keep_training(tmp_path, good_ckpt,
                                                             no_leftover_ranks):
    ref = run(_loaded, 2, good_ckpt)[0]
    assert ref["info"] == {"step": 2, "saved_world": 2, "rng": "restored"}
    for got in (run(_loaded, 4, good_ckpt)[0], _loaded(good_ckpt)):  # 4 ranks; this process
        assert got["info"] == {"step": 2, "saved_world": 2, "rng": "reseeded"}
        torch.testing.assert_close(got["model"], ref["model"], rtol=0, atol=0)
        torch.testing.assert_close(got["optim"]["state"], ref["optim"]["state"], rtol=0, atol=0)
        assert got["optim"]["param_groups"] == ref["optim"]["param_groups"]
    # one more step: the same global batch of 4 sequences split 2 x 2, 4 x 1, 1 x 4 (losses are
    # float32 values stored as Python floats: float32 tolerance)
    after = {}
    for world in (2, 4, 1):
        shutil.copytree(good_ckpt, tmp_path / f"w{world}" / good_ckpt.name)
        after[world] = run(train, world, "tiny", 3, ckpt_dir=tmp_path / f"w{world}", every=2,
                           batch_size=4 // world)[0]
        assert after[world]["resumed_from"] == 2
    ref_rest, ref_keys = split_key_bias(after[2]["params"])
    for world in (4, 1):
        torch.testing.assert_close(after[world]["losses"], after[2]["losses"], rtol=1e-5, atol=0)
        rest, keys = split_key_bias(after[world]["params"])
        torch.testing.assert_close(rest, ref_rest)
        # key biases: zero gradient in exact arithmetic, Adam amplifies the rounding noise
        torch.testing.assert_close(keys, ref_keys, rtol=0, atol=2e-3)  # steps * lr


def _load_tiny_then_small(path):
    model, optimizer = build("tiny")
    assert load_checkpoint(path, model, optimizer)["step"] == 2  # the right model loads
    model, optimizer = build("small")
    load_checkpoint(path, model, optimizer)


def test_foreign_model_checkpoint_gives_clear_error(good_ckpt, no_leftover_ranks):
    with pytest.raises(RankError, match=r"foreign checkpoint: parameter '[\w.]+' has shape"):
        run(_load_tiny_then_small, 2, good_ckpt)


def test_checkpoint_bytes_match_model_and_adam_state(good_ckpt):
    # fp32 weights + Adam's two fp32 moments = 12 bytes per parameter, plus small per-tensor
    # headers (torch.save's zip records) and Adam's scalar step counters.
    n = param_count(get_config("tiny"))
    shards = sum(p.stat().st_size for p in good_ckpt.glob("*.distcp"))
    manifest = json.loads((good_ckpt / "manifest.json").read_text())
    assert shards == sum(v["bytes"] for k, v in manifest["files"].items() if k.endswith(".distcp"))
    assert 12 * n <= shards <= 12 * n * 1.25, (shards, 12 * n)
