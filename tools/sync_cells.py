"""Write the library's current definitions into the notebooks' tagged cells (or, with --check, list the drift).

    python -m tools.sync_cells [--check] [notebook.ipynb ...]     (default: every chapter)

A code cell whose metadata says ``"library_copy": "course_lib.<folder>.<module>"`` is the
learner's editable copy of that module's functions and classes. Each top-level ``def``/``class``
of the cell that differs from the module's (as an AST: docstrings count, comments and formatting
do not) is replaced by the module's source text of that name; the cell's other statements,
definitions equal to the module's, untagged cells, outputs and metadata stay byte for byte.
``--check`` writes nothing and exits 1 if a cell differs. ``tests/test_cell_library_identity.py``
runs the same comparison and points here. A cell name the module lacks cannot be synced: fix it
by hand (the command lists it and exits 1).

A code cell whose metadata says ``"script_copy": "course_lib/scripts/NAME.py"`` holds a whole
script under one ``%%torchrun NPROC NAME.py`` line: everything after that line must equal the
file, byte for byte; syncing writes the file's text under the cell's own first line.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
KEY = "library_copy"
SCRIPT_KEY = "script_copy"
COMMAND = "python -m tools.sync_cells"


def tagged_cells(path: Path) -> list[tuple[int, str, str]]:
    """(cell index, module name, source) of every cell tagged as a library copy."""
    cells = json.loads(path.read_text())["cells"]
    return [(i, c["metadata"][KEY], "".join(c["source"])) for i, c in enumerate(cells)
            if c["cell_type"] == "code" and KEY in c.get("metadata", {})]


def script_cells(path: Path) -> list[tuple[int, str, str]]:
    """(cell index, script path, source) of every cell tagged as a script copy."""
    cells = json.loads(path.read_text())["cells"]
    return [(i, c["metadata"][SCRIPT_KEY], "".join(c["source"])) for i, c in enumerate(cells)
            if c["cell_type"] == "code" and SCRIPT_KEY in c.get("metadata", {})]


def script_path(script: str) -> Path:
    """The file of ``script`` (``course_lib/scripts/NAME.py``) in this checkout."""
    path = ROOT / script
    if not (script.startswith("course_lib/scripts/") and script.endswith(".py")) or not path.is_file():
        raise FileNotFoundError(f"no script {script} in {ROOT / 'course_lib' / 'scripts'}")
    return path


def script_drift(cell_source: str, script: str, script_source: str) -> list[str]:
    """What differs between a ``%%torchrun`` cell and its script (empty: identical)."""
    first, _, body = cell_source.partition("\n")
    words = first.split()
    name = script.rsplit("/", 1)[-1]
    if words[:1] != ["%%torchrun"] or name not in words[2:3]:
        return [f"the first line is not '%%torchrun NPROC {name}'"]
    return [] if body == script_source else [f"the cell's script differs from {script}"]


def module_path(module: str) -> Path:
    """The file of ``module`` in this checkout (not whatever copy of course_lib is installed)."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    if not module.startswith("course_lib.") or not path.is_file():
        raise FileNotFoundError(f"no module {module} in {ROOT / 'course_lib'}")
    return path


def definitions(source: str) -> dict[str, ast.AST]:
    return {node.name: node for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def drift(cell_source: str, module_source: str, module: str) -> list[str]:
    """What differs between a cell's definitions and the module's (empty: identical)."""
    mine, theirs = definitions(cell_source), definitions(module_source)
    if not mine:
        return ["the cell defines no function or class"]
    problems = []
    for name, node in mine.items():
        if name not in theirs:
            problems.append(f"{name} is not defined in {module}")
        elif ast.dump(node) != ast.dump(theirs[name]):
            problems.append(f"{name} differs from {module}.{name}")
    return problems


def _span(node: ast.AST) -> tuple[int, int]:
    """First and last line (0-based, inclusive) of a definition, decorators included."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first - 1, node.end_lineno - 1


def synced(cell_source: str, module_source: str) -> str:
    """``cell_source`` with every definition that differs from the module's replaced by its text."""
    mine, theirs = definitions(cell_source), definitions(module_source)
    lines, library = cell_source.splitlines(keepends=True), module_source.splitlines(keepends=True)
    for name, node in sorted(mine.items(), key=lambda item: -item[1].lineno):   # bottom up
        if name in theirs and ast.dump(node) != ast.dump(theirs[name]):
            first, last = _span(node)
            lib_first, lib_last = _span(theirs[name])
            text = "".join(library[lib_first:lib_last + 1]).rstrip("\n")
            ending = lines[last][len(lines[last].rstrip("\n")):]   # keep the cell's own line end
            lines[first:last + 1] = [text + ending]
    return "".join(lines)


def sync_notebook(path: Path, write: bool = True) -> list[str]:
    """Sync (or, with ``write=False``, only inspect) one notebook; returns what differed."""
    original = path.read_text()
    nb = json.loads(original)
    problems = []
    for i, cell in enumerate(nb["cells"]):
        meta = cell.get("metadata", {})
        script, module = meta.get(SCRIPT_KEY), meta.get(KEY)
        if cell["cell_type"] != "code" or (script is None and module is None):
            continue
        source = "".join(cell["source"])
        try:  # the copy's home: a script, or a library module
            home = (script_path(script) if script is not None else module_path(module)).read_text()
        except FileNotFoundError as err:
            problems.append(f"{path.name} cell {i}: {err}")
            continue
        if script is not None:
            found = script_drift(source, script, home)
            new = (source.partition("\n")[0] + "\n" + home
                   if found and source.startswith("%%torchrun") else source)
        else:
            found = drift(source, home, module)
            new = synced(source, home)
        problems += [f"{path.name} cell {i}: {p}" for p in found]
        if new != source:
            cell["source"] = new.splitlines(keepends=True)
    out = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if write and out != original:
        path.write_text(out)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on any drift")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter notebook")
    args = parser.parse_args(argv)
    problems = []
    for path in args.notebooks or NOTEBOOKS:
        problems += sync_notebook(path, write=not args.check)
    unsyncable = [p for p in problems if "differs from" not in p and "script differs" not in p]
    for p in problems:
        print(p if args.check or p in unsyncable else p + ": written from the library")
    return 1 if (args.check and problems) or unsyncable else 0


if __name__ == "__main__":
    sys.exit(main())
