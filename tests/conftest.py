"""Shared fixtures: a check that a test leaves no rank process behind."""
from __future__ import annotations

import pytest

from processes import rank_processes, wait_gone


@pytest.fixture
def no_leftover_ranks():
    yield
    leftovers = [p.pid for p in rank_processes()]
    assert wait_gone(leftovers) == [], f"processes left behind: {leftovers}"
