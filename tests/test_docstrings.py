"""Module docstrings say what and why in a few lines (docs/architecture.md): at most 12 here.

Lab notes (what was measured, version quirks, history) go to docs/modules/<folder>.md under the
module's path (issue 32 trimmed the last long ones; no module is exempt).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "course_lib"
MAX_LINES = 12
MODULES = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py"))


def docstring_lines(module: str) -> int:
    doc = ast.get_docstring(ast.parse((ROOT / module).read_text()), clean=False)
    return len(doc.strip().splitlines()) if doc else 0


@pytest.mark.parametrize("module", MODULES)
def test_module_docstring_is_a_few_lines(module):
    n = docstring_lines(module)
    assert n <= MAX_LINES, (f"course_lib/{module}'s docstring has {n} lines (at most "
                            f"{MAX_LINES}): keep what and why, move measurements and "
                            "history to docs/modules/<folder>.md under the module's path")


def test_every_module_has_a_docstring():
    assert [m for m in MODULES if docstring_lines(m) == 0 and m != "__init__.py"] == []
