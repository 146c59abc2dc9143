"""The ``clock`` list in tests/conftest.py names tests that exist, so CI's loaded rerun is not empty."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("_tests_conftest", ROOT / "tests" / "conftest.py")
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_clock_entry_names_an_existing_test_module_or_function():
    missing = []
    for entry in conftest.CLOCK:
        file, _, name = entry.partition("::")
        path = ROOT / file
        if not path.is_file() or (name and name not in _tests_in(path)):
            missing.append(entry)
    assert missing == [], f"clock entries that name no test: {missing}"


def test_clock_entries_cover_every_launcher_test_module():
    modules = {f"tests/launcher/{p.name}" for p in (ROOT / "tests" / "launcher").glob("test_*.py")}
    listed = {e for e in conftest.CLOCK if "::" not in e}
    no_clock = {"tests/launcher/test_devices.py", "tests/launcher/test_figures_launcher.py"}  # no deadline
    assert modules - no_clock <= listed


def test_every_timed_entry_names_an_existing_test_and_none_is_also_a_clock_test():
    missing = [e for e in conftest.TIMED
               if not (ROOT / e.partition("::")[0]).is_file()
               or e.partition("::")[2] not in _tests_in(ROOT / e.partition("::")[0])]
    assert missing == [], f"timed entries that name no test: {missing}"
    clock_files = {e for e in conftest.CLOCK if "::" not in e}
    both = [e for e in conftest.TIMED if e in conftest.CLOCK or e.partition("::")[0] in clock_files]
    assert both == [], f"under load these would skip instead of measuring: {both}"
