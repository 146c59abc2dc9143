"""The statements of docs/architecture.md that a test can check, checked against the code.

The lists (function-local imports, matplotlib importers, the files naming the GPT's submodules,
the predictors with a literal ``4``) are read from the page itself, so the page and the code
cannot drift apart: a change that breaks a statement fails here until the page says what is
true. The chapters' order comes from ``tests/test_layout.py`` (``CHAPTERS``), its one home.
docs/decisions.md's module notes and their headings are checked too (its entries:
tests/test_decisions.py).
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.test_layout import (BOTTOM, CHAPTERS, ROOT, graph, imported, imports, module_name,
                               room)

REPO = ROOT.parent
PAGE = (REPO / "docs" / "architecture.md").read_text()
DECISIONS = (REPO / "docs" / "decisions.md").read_text()
PY_PATH = re.compile(r"`([\w./]+\.py)`")

#: The arrows that point back up between the bottom layers today. Issue 51 (the `names` branch)
#: moves the machine probe (`usable_cores`) into common/; the integrator empties this after the merge.
BACK_ARROWS: set = set()
LAYER = {"display": 0, "common": 1, "launcher": 2, "exercises": 3}


def between(text: str, start: str, end: str) -> str:
    """The text from ``start`` up to ``end`` (both must be there)."""
    assert start in text, f"docs/architecture.md no longer says {start!r}"
    rest = text[text.index(start):]
    assert end in rest, f"docs/architecture.md: {end!r} no longer follows {start!r}"
    return rest[:rest.index(end)]


def files(text: str) -> set[str]:
    """The course_lib modules ``text`` names as `folder/module.py` (or a top-level `module.py`)."""
    return {t for t in PY_PATH.findall(text)
            if not t.startswith(("tests/", "benchmarks/", "course_lib/", "docs/"))
            and ("/" in t or (ROOT / t).is_file())}


def local_imports(path: Path) -> set[str]:
    """Modules imported inside a function or method of ``path`` (relative imports resolved)."""
    name = module_name(path, ROOT)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            out |= imported(node, package)
    return out


def source_files() -> dict[str, Path]:
    return {str(p.relative_to(ROOT)): p for p in sorted(ROOT.rglob("*.py"))}


def test_one_section_per_heading_and_one_how_run_works():
    headings = re.findall(r"^#+ .*$", PAGE, re.M)
    assert len(headings) == len(set(headings)), "a heading appears twice"
    assert sum(h.startswith("## How `run` works") for h in headings) == 1


def test_the_bottom_layers_stack_with_only_the_listed_arrow_back_up():
    edges = graph(ROOT)
    up = {(src, dst) for src, targets in edges.items() for dst in targets
          if room(src) in LAYER and room(dst) in LAYER and LAYER[room(dst)] > LAYER[room(src)]}
    assert up - BACK_ARROWS == set(), "a bottom layer imports one above it"
    # the page names the one arrow left
    for src, dst in BACK_ARROWS:
        path = lambda m: m.removeprefix("course_lib.").replace(".", "/") + ".py"  # noqa: E731
        assert f"`{path(src)}` → `{path(dst)}`" in PAGE


def test_the_map_lists_the_folders_in_course_order_and_names_every_module():
    section = between(PAGE, "## course_lib, by concept", "\nRules.")
    block = section.split("```")[1]
    folders: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        match = re.match(r"^  ([a-z_]+)/", line)
        if match:
            current = match.group(1)
            folders[current] = line[match.end():]
        elif current and line.startswith("    "):
            folders[current] += " " + line
    assert list(folders) == BOTTOM[:2] + CHAPTERS + ["scripts"]
    unnamed = {}
    for folder, text in folders.items():
        words = set(re.findall(r"\w+", text))
        missing = [p.stem for p in sorted((ROOT / folder).glob("*.py"))
                   if p.stem != "__init__" and p.stem not in words]
        if missing:
            unnamed[folder] = missing
    assert unnamed == {}, "modules the map does not name"


def test_the_file_roles_the_page_states():
    assert all((ROOT / c / "show.py").is_file() for c in CHAPTERS)
    assert [c for c in CHAPTERS if not (ROOT / c / "exercises.py").is_file()] == ["capstone"]
    numbers = {"six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
    stated = re.search(r"`measure\.py` in (\w+) folders", PAGE).group(1)
    assert sum((ROOT / c / "measure.py").is_file() for c in CHAPTERS) == numbers[stated]


def test_function_local_course_lib_imports_are_in_the_listed_files_only():
    listed = files(between(PAGE, "- function-local imports of course_lib modules",
                           "- function-local imports of other libraries"))
    found = {rel for rel, path in source_files().items()
             if any(m == "course_lib" or m.startswith("course_lib.") for m in local_imports(path))}
    assert found - listed == set(), "function-local course_lib imports the page does not list"
    assert listed - found == set(), "the page lists files without a function-local course_lib import"


def test_function_local_imports_of_other_libraries_are_the_listed_kinds():
    allowed = set(re.findall(r"`(\w+)`", between(PAGE, "- function-local imports of other libraries",
                                                 "\nReports:")))
    found = {}
    for rel, path in source_files().items():
        for m in local_imports(path):
            top = m.split(".")[0]
            if top and top != "course_lib" and top not in sys.stdlib_module_names and top not in allowed:
                found.setdefault(top, []).append(rel)
    assert found == {}


def test_matplotlib_and_ipywidgets_only_where_the_page_says():
    bullet = between(PAGE, "- only presentation modules import", "- every file at most")
    named = files(bullet)

    def importers(lib):
        return {rel for rel, path in source_files().items()
                if any(i.split(".")[0] == lib for i in imports(path, module_name(path, ROOT)))}

    shows = {rel for rel in source_files() if rel.endswith("/show.py")}
    assert importers("matplotlib") == shows | (named - {"launcher/progress.py"})
    chapter_shows = {f"{c}/show.py" for c in CHAPTERS}
    assert importers("ipywidgets") == chapter_shows | {"launcher/progress.py"}


def test_the_change_table_lists_every_file_naming_the_gpt_submodules():
    row = next(line for line in PAGE.splitlines() if line.startswith("| the GPT's structure"))
    names = re.compile(r"\b(tok_emb|pos_emb|lm_head|ln_f|ln1|ln2)\b|\.blocks\b|[\"']blocks\.|"
                       r"\battn\.(qkv|proj)\b|\bmlp\.(fc|proj)\b|\.(qkv|attn|mlp|fc)\b")
    found = {rel for rel, path in source_files().items() if names.search(path.read_text())}
    assert found - {"common/models.py"} == files(row) - {"common/models.py"}


def test_the_predictors_named_with_a_literal_4_still_have_one():
    row = next(line for line in PAGE.splitlines() if line.startswith("| a bytes-per-element size"))
    named = files(row) - {"common/dtypes.py"}
    assert named
    literal = re.compile(r"(?<![\w.])4 \*|\* 4(?![\w.])")
    assert [f for f in sorted(named) if not literal.search((ROOT / f).read_text())] == []


def _exists(token: str) -> bool:
    token = token.rstrip("/")
    if any((base / token).exists() for base in (REPO, ROOT, REPO / "docs")):
        return True
    if "/" in token:
        return False
    return any(any(REPO.glob(f"{top}/**/{token}")) for top in ("course_lib", "tests", "tools", "docs"))


def test_every_file_the_page_names_exists():
    tokens = set(re.findall(r"`([^`\s]+)`", PAGE))
    paths = [t for t in tokens
             if re.search(r"\.(py|json|toml|md|cfg|txt|ipynb)$|/$|^\.ci/|^(tests|tools|benchmarks|data|docs)/", t)
             and not re.search(r"[<>*{}…]|NAME|NN_|^_build/", t)]
    assert len(paths) > 100
    assert [t for t in sorted(paths) if not _exists(t)] == []


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_decisions_index_and_the_module_notes_resolve():
    """The index's own entries are checked in tests/test_decisions.py; here its module notes."""
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", DECISIONS, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", DECISIONS)
    assert links and [a for a in links if a not in anchors] == []
    notes = re.findall(r"\]\((modules/[\w.]+\.md)\)", DECISIONS)
    assert notes and [n for n in notes if not (REPO / "docs" / n).is_file()] == []
    for page in sorted((REPO / "docs" / "modules").glob("*.md")):
        heads = re.findall(r"^## (\S+\.py)$", page.read_text(), re.M)
        assert heads, page
        assert [h for h in heads if not (ROOT / h).is_file()] == [], f"{page.name}: notes of a module that is gone"


@pytest.mark.parametrize("section", ["## Index", "## Module notes"])
def test_decisions_has_its_index_and_module_notes(section):
    assert section in DECISIONS
