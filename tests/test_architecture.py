"""The statements of docs/architecture.md that a test can check, checked against the code.

The lists (function-local imports, matplotlib importers, the files naming the GPT's submodules,
the predictors with a literal ``4``) are read from the page itself, so the page and the code
cannot drift apart: a change that breaks a statement fails here until the page says what is
true. The chapters' order comes from ``tests/test_layout.py`` (``CHAPTERS``), its one home.
docs/decisions.md's module notes and their headings are checked too (its entries:
tests/test_decisions.py). In architecture.md and every docs/modules/*.md: each name written in
backticks (and each function the map's block names) is spelled by the code, each file named
exists, a line count quoted as ```path.py` (~N lines)`` is within 10 %, and each ``COURSE_*``
variable is read by the code with the default the page states.
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
    assert [c for c in CHAPTERS if not (ROOT / c / "exercises.py").is_file()] == []
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


# --- Names, line counts and environment variables in architecture.md and docs/modules/*.md ---
PAGES = {p.relative_to(REPO).as_posix(): p.read_text()
         for p in [REPO / "docs" / "architecture.md", *sorted((REPO / "docs" / "modules").glob("*.md"))]}
#: Names the pages mention that belong to torch or another library and that the course's own code
#: never spells, or a variable's method (checked by hand against torch 2.13, DeepSpeed 0.19, glibc,
#: PyPI), and a wrong name a correction note quotes as history.
EXTERNAL = {"_use_grad_for_differentiable", "torch._disable_dynamo", "glibc.malloc.mmap_threshold",
            "_use_sharded_views", "torch.distributed.tensor.debug.CommDebugMode", "NF4Tensor",
            "accelerate", "huggingface_hub", "pyyaml", "safetensors", "tokenizers", "tqdm",
            "transformers", "c_k", "ddp.no_sync", "engine.backward", "engine.step",
            "data_parallel.show.plot_collective"}
#: torch's own files a page names (torch/distributed/...), not the course's.
TORCH_FILES = {"default_planner.py", "filesystem.py", "fsdp/_flat_param.py"}


def _code_words() -> tuple[set[str], dict[str, str]]:
    """Every identifier the code spells (names, and words inside its strings, which is where
    commands, environment variables and dict keys live), and each .py file's text by its stem."""
    words, by_stem = set(), {}
    for top in ("course_lib", "tests", "tools", "benchmarks", "docs/site", ".ci"):
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and (path.suffix == ".py" or top == ".ci"):
                text = path.read_text()
                words |= set(re.findall(r"[A-Za-z_]\w*", text))
                by_stem.setdefault(path.stem, "")
                by_stem[path.stem] += text
    return words, by_stem


WORDS, BY_STEM = _code_words()
IDENT = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\(\))?")


def _names(text: str) -> set[str]:
    """What a page writes in backticks as a name: an identifier or a dotted one, maybe with ()."""
    return {t.removesuffix("()") for t in re.findall(r"`([^`\n]+)`", text)
            if IDENT.fullmatch(t) and not re.search(r"\.(py|md|json|toml|cfg|txt|ipynb)$", t)}


def _missing(name: str) -> bool:
    parts = name.split(".")
    if name in EXTERNAL:
        return False
    if any(p not in WORDS for p in parts):
        return True
    # `module.attr` of a course module: that module's text must spell the attribute
    if len(parts) == 2 and parts[0] in BY_STEM and parts[0] not in ("torch", "dist", "os"):
        return not re.search(rf"\b{re.escape(parts[1])}\b", BY_STEM[parts[0]])
    return False


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_name_a_page_mentions_is_in_the_code(page):
    text = PAGES[page]
    names = _names(text)
    if page.endswith("architecture.md"):  # the map's block names functions without backticks
        block = between(text, "## course_lib, by concept", "\nRules.").split("```")[1]
        names |= {w for w in re.findall(r"\b[A-Za-z_]\w*\b", block) if "_" in w.strip("_")}
    assert sorted(n for n in names if _missing(n)) == []


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_file_a_page_names_exists_and_its_line_count_holds(page):
    text = PAGES[page]
    for token in re.findall(r"`([\w./-]+\.(?:py|md|json|toml|cfg|txt|ipynb))`", text):
        if token not in TORCH_FILES and not re.search("NAME|NN_", token):
            assert _exists(token) or _exists(token.split("/")[-1]), token
    quoted = re.findall(r"`([\w/]+\.py)`,? \(?~(\d+) lines", text)
    assert len(quoted) == len(re.findall(r"~\d+ lines", text)), "a line count not tied to a file"
    for name, stated in quoted:
        path = next(p for p in (ROOT / name, REPO / name) if p.is_file())
        actual = len(path.read_text().splitlines())
        assert abs(actual - int(stated)) <= 0.1 * actual, (name, stated, actual)


def _code_default(var: str) -> str | None:
    for text in BY_STEM.values():
        m = re.search(rf"""environ\.get\(\s*["']{var}["']\s*,\s*["']([^"']*)["']""", text)
        if m:
            return m.group(1)
    return None


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_environment_variable_a_page_names_is_read_with_the_stated_default(page):
    text = re.sub(r"\s+", " ", PAGES[page])
    for var in set(re.findall(r"\b(COURSE_[A-Z_]+)\b", text)):
        assert any(f'"{var}"' in t or f"'{var}'" in t for t in BY_STEM.values()), var
    stated = re.findall(r"`(COURSE_[A-Z_]+)`? \(default ([^)`]+)\)", text)
    stated += re.findall(r"`(COURSE_[A-Z_]+)(?:=| = `)(\w+)`? \(default\)", text)
    for var, default in stated:
        assert _code_default(var) == default.strip("`"), (var, default)
