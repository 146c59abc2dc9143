"""A checkpoint saved under one Python loads under another (issue 57): two real interpreters.

Debian 12's own ``python3`` (3.11.2) pickles DCP's Enum member by name, 3.11.7 by value; each
saves the tiny GPT's checkpoint (one gloo rank) and the other loads it with the course's safe
loader, to the same bytes. ``COURSE_OTHER_PYTHON`` names the second interpreter (one with the
course's requirements, e.g. a venv of Debian's ``python3``); without it the test skips, saying so.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OTHER = os.environ.get("COURSE_OTHER_PYTHON")
pytestmark = pytest.mark.skipif(
    not OTHER, reason="set COURSE_OTHER_PYTHON to a second interpreter with the course's "
                      "requirements (e.g. a venv of Debian's python3) to load across them")


def _run(python: str, action: str, folder: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([python, str(Path(__file__).with_name("cross_python.py")), action,
                           str(folder)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("direction", ["this saves, the other loads",
                                       "the other saves, this loads"])
def test_a_checkpoint_saved_under_one_interpreter_loads_under_the_other(tmp_path, direction):
    saver, loader = (sys.executable, OTHER) if direction.startswith("this") else (OTHER,
                                                                                   sys.executable)
    saved = _run(saver, "save", tmp_path)
    loaded = _run(loader, "load", tmp_path)
    assert saved["python"] != loaded["python"], "COURSE_OTHER_PYTHON is this same version"
    assert saved["metadata_by_name"] == saved["by_name"]  # the form that interpreter writes
    assert loaded["digest"] == saved["digest"]
