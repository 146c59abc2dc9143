"""Chapter 12: break it and resume. A rank killed under torchrun --max-restarts resumes from the
last committed checkpoint and ends with the uninterrupted run's weights, bit for bit; a
checkpoint of one layout resumes on another (DCP reshards) and the curve continues."""
from __future__ import annotations

import pytest
import torch

from course_lib import torchrun
from course_lib.capstone.measure import train_gpt
from course_lib.fault_tolerance.training import FAULTS_ENV

STEPS = 8
RUN = {"preset": "tiny", "steps": STEPS, "lr": 3e-3, "eval_every": 4}


@pytest.fixture(scope="module")
def uninterrupted():
    return train_gpt({"dp_shard": 2}, **RUN)


def test_killed_rank_resumes_to_the_same_weights_bit_for_bit(uninterrupted, tmp_path):
    out = tmp_path / "final.pt"
    args = ["--preset", "tiny", "--steps", STEPS, "--lr", 3e-3, "--eval-every", 4,
            "--layout", "dp_shard=2", "--every", 4, "--ckpt-dir", tmp_path / "ckpt", "--out", out]
    result = torchrun("course_lib.capstone.train_gpt", 2, args, max_restarts=1, module=True,
                      env={FAULTS_ENV: "0:1:6:kill"}, timeout=300, quiet=True)
    assert "attempt 1: layout {'dp_shard': 2}, resumed from step 4" in result.output
    saved = torch.load(out, weights_only=True)
    assert saved["losses"].tolist() == uninterrupted.losses
    ref = uninterrupted.params
    assert saved["params"].keys() == ref.keys()
    assert all(torch.equal(saved["params"][k], ref[k]) for k in ref)


def test_resume_on_another_layout_continues_the_curve(uninterrupted, tmp_path):
    first = train_gpt({"dp_shard": 2}, **{**RUN, "steps": 4}, ckpt_dir=tmp_path, every=4)
    second = train_gpt({"dp": 2}, **RUN, ckpt_dir=tmp_path, every=4)
    assert second.resumed_from == 4 and second.losses[:4] == first.losses
    diff = max(abs(a - b) for a, b in zip(second.losses, uninterrupted.losses))
    assert diff < 1e-4  # the same data position, the same Adam state: the same curve
    assert [s for s, _ in second.val_losses] == [4, 8]


def test_a_checkpoint_of_another_tp_degree_is_refused(tmp_path):
    train_gpt({"dp_shard": 2}, **{**RUN, "steps": 2}, ckpt_dir=tmp_path, every=2)
    again = train_gpt({"tp": 2}, **{**RUN, "steps": 2}, ckpt_dir=tmp_path, every=0)
    assert again.resumed_from is None  # skipped with a logged reason: qkv rows differ


def test_the_script_reads_its_toml_config_and_refuses_unknown_keys(tmp_path):
    from course_lib.capstone.train_gpt import parse_args
    shipped = parse_args(["--config", "course_lib/capstone/train_gpt.toml", "--steps", "3"])
    assert shipped["layout"] == {"dp_shard": 2, "tp": 2} and shipped["steps"] == 3
    assert parse_args(["--layout", ""])["layout"] == {}
    bad = tmp_path / "bad.toml"
    bad.write_text("[training]\nstep = 3\n")
    with pytest.raises(ValueError, match=r"\[training\] has no option 'step'"):
        parse_args(["--config", str(bad)])
    with pytest.raises(ValueError, match="expected name=size"):
        parse_args(["--layout", "dp_shard:2"])
