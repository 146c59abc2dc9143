"""Chapter 12's train.py exercise is course_lib/scripts/train.py with gaps: the notebook's stub,
its gaps filled with the folded solution's blocks, is the script byte for byte.

The stub cell (metadata ``"script_gaps": "course_lib/scripts/train.py"``) assigns the script
to ``train_py`` as a raw string in which each gap is one line ``...  # GAP N: what to write``,
indented as the code it stands for; the Solution cell below it holds one fenced block per gap,
opening with ``# GAP N``. When train.py changes, change the stub and the solution with it.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from course_lib.capstone.exercises import _TRAIN_GAP, grade_train_py

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "12_capstone_train_gpt.ipynb"
_BLOCK = re.compile(r"```python\n# GAP (\w+)\n(.*?)```", re.S)


def _stub_and_solution() -> tuple[str, str, str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    i = next(i for i, c in enumerate(cells) if "script_gaps" in c["metadata"])
    tree = ast.parse("".join(cells[i]["source"]))
    stub = next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                and n.targets[0].id == "train_py")
    return stub, "".join(cells[i + 1]["source"]), cells[i]["metadata"]["script_gaps"]


def filled(stub: str, solution: str) -> str:
    """The stub with each GAP line replaced by its solution block, at the gap's indentation."""
    blocks = {gid: body.rstrip("\n").split("\n") for gid, body in _BLOCK.findall(solution)}
    out = []
    for line in stub.split("\n"):
        found = _TRAIN_GAP.match(line)
        if not found:
            out.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        out += [indent + b if b else b for b in blocks[found.group(1)]]
    return "\n".join(out)


def test_the_stub_filled_with_the_solution_is_the_course_script():
    stub, solution, script = _stub_and_solution()
    gaps = _TRAIN_GAP.findall(stub)
    assert 3 <= len(gaps) and sorted(gaps) == sorted(g for g, _ in _BLOCK.findall(solution))
    assert "<summary>Solution" in solution
    assert filled(stub, solution) == (ROOT / script).read_text(), (
        f"the notebook's train.py stub + solution differ from {script}: change both")


def test_the_stub_gives_no_gap_away():
    stub, solution, _ = _stub_and_solution()
    for _, body in _BLOCK.findall(solution):
        for line in filter(str.strip, body.split("\n")):
            if "(" in line:  # a call of torch's API, not a plain `if rank == 0:`
                assert line.strip() not in stub, f"the stub shows a line of the solution: {line!r}"


def test_a_changed_script_line_is_caught():
    stub, solution, script = _stub_and_solution()
    broken = solution.replace('mesh_dim_names=("dp", "tp")', 'mesh_dim_names=("tp", "dp")')
    assert broken != solution and filled(stub, broken) != (ROOT / script).read_text()


def test_an_unfilled_gap_starts_nothing_and_says_which():
    stub, _, _ = _stub_and_solution()
    got = grade_train_py(stub)
    assert not got.passed and got.message.startswith("not answered yet: fill GAP 1, 2,")


def test_the_filled_stub_passes_and_a_rank_local_batch_fails():
    stub, solution, _ = _stub_and_solution()
    good = filled(stub, solution)
    assert grade_train_py(good).passed
    # every dp rank reading the same micro-batches (the sampler told dp 1, rank 0): not the mean
    bad = good.replace("num_replicas=dp, rank=mesh[\"dp\"].get_local_rank()", "num_replicas=1, rank=0")
    assert bad != good
    got = grade_train_py(bad)
    assert not got.passed and "NOT YET" in repr(got), got.message
