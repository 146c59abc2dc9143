"""A small good checkpoint for the trust tests, saved once per session in this process."""
from __future__ import annotations

import shutil

import pytest

from course_lib.fault_tolerance.training import train


@pytest.fixture(scope="session")
def saved_ckpt(tmp_path_factory):
    """``step_000002`` of the tiny GPT saved by one process (world size 1: one shard file)."""
    root = tmp_path_factory.mktemp("saved")
    train("tiny", 2, ckpt_dir=root, every=2)
    return root / "step_000002"


@pytest.fixture
def ckpt(tmp_path, saved_ckpt):
    """A fresh copy of :func:`saved_ckpt` to attack, in its own root ``tmp_path / "root"``."""
    dst = tmp_path / "root" / saved_ckpt.name
    shutil.copytree(saved_ckpt, dst)
    return dst
