"""The layout rules of course_lib (docs/architecture.md), checked on the source itself.

Folders by concept in course order; a chapter imports only earlier chapters and the bottom
layers; no import circles (module-level and function-level imports alike); only presentation
modules import matplotlib or ipywidgets; every file at most 300 lines.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "course_lib"
MAX_LINES = 300
TOP_MODULES = {"__init__.py", "exercises.py", "display.py"}
BOTTOM = ["launcher", "common", "exercises", "display"]  # any chapter may import these
CHAPTERS = ["memory", "data_parallel", "sharding", "tensor_parallel", "pipeline_parallel",
            "communication", "fault_tolerance", "plan", "finetuning", "deepspeed",
            "composition", "debugging", "communicating_less", "capstone"]
PRESENTATION = {"show", "plots", "widgets", "progress"}
GUI = ("matplotlib", "ipywidgets")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str) -> set[str]:
    """Every module this file imports, anywhere in it (top level, functions, methods)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        out |= imported(node, package, names=True)
    return out


def imported(node: ast.AST, package: str, names: bool = False) -> set[str]:
    """The modules one import statement names (relative ones resolved; ``names``: each
    ``module.name`` of a from-import too); empty for any other node."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    return {base} | ({f"{base}.{a.name}" for a in node.names} if names else set())


def graph(root: Path) -> dict[str, set[str]]:
    """Internal import graph: module -> course_lib modules it imports (packages resolved to
    the module named, ``from pkg import mod`` to ``pkg.mod``)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    edges = {}
    for name, path in files.items():
        targets = set()
        for imp in imports(path, name):
            if imp in files and imp != name and imp != root.name:
                targets.add(imp)
        # "from pkg import mod" also yields "pkg": drop the package when a module below it is named
        edges[name] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def room(module: str) -> str:
    """The folder (or top-level module) a module lives in: ``course_lib.memory.show`` -> memory."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def order_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in edges.items():
        a = room(src)
        if a not in CHAPTERS:
            if a in BOTTOM or a in ("", "scripts"):
                bad += [f"{src} -> {t}" for t in targets
                        if a in BOTTOM and room(t) in CHAPTERS]
            continue
        for t in targets:
            b = room(t)
            if b in CHAPTERS and CHAPTERS.index(b) > CHAPTERS.index(a):
                bad.append(f"{src} -> {t}")
    return bad


def test_the_checker_finds_a_circle_and_a_later_chapter(tmp_path):
    # layout-rewrite: skip (synthetic module names below are not references to rewrite)
    pkg = tmp_path / "course_lib"
    for folder in ("memory", "sharding"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "memory" / "a.py").write_text("def f():\n    from course_lib.sharding import b\n")
    (pkg / "sharding" / "b.py").write_text("from course_lib.memory.a import f\n")
    edges = graph(pkg)
    assert edges["course_lib.memory.a"] == {"course_lib.sharding.b"}  # function-level counts
    assert cycles(edges) == [["course_lib.memory.a", "course_lib.sharding.b"]]
    assert order_violations(edges) == ["course_lib.memory.a -> course_lib.sharding.b"]
    (pkg / "memory" / "a.py").write_text("X = 1\n")
    assert cycles(graph(pkg)) == [] and order_violations(graph(pkg)) == []


def test_top_level_holds_only_the_facade_the_folders_and_a_few_modules():
    entries = {p.name for p in ROOT.iterdir() if p.name != "__pycache__"}
    assert entries == TOP_MODULES | set(BOTTOM[:2]) | set(CHAPTERS) | {"scripts"}


def test_every_file_is_at_most_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_import_circles():
    assert cycles(graph(ROOT)) == []


def test_a_chapter_imports_only_earlier_chapters_and_the_bottom_layers():
    assert order_violations(graph(ROOT)) == []


def test_only_presentation_modules_import_matplotlib_or_ipywidgets():
    offenders = []
    for path in ROOT.rglob("*.py"):
        name = module_name(path, ROOT)
        gui = {i for i in imports(path, name) if i.split(".")[0] in GUI}
        if gui and path.stem not in PRESENTATION:
            offenders.append(f"{name}: {sorted(gui)}")
    assert offenders == []


@pytest.mark.parametrize("folder", CHAPTERS + BOTTOM[:2])
def test_each_folder_is_a_package(folder):
    assert (ROOT / folder / "__init__.py").is_file()
