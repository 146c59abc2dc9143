"""Chapter 09's scripts (course_lib/scripts/fsdp_tp.py, hsdp.py) under the real torchrun on 4 CPU
ranks equal one process; each broken variant, the mistake a learner makes, is seen failing.

Run through ``%%torchrun``'s own function, ``script_magic.run_script`` (tolerance 1e-4: float32
sums in another order). A broken variant must differ from one process by more than 10× that at
some step.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from course_lib.launcher.script_magic import run_script

SCRIPTS = Path(__file__).resolve().parents[2] / "course_lib" / "scripts"
STEPS = 8  # tiny.STEPS

BROKEN = [
    ("fsdp_tp.py", "the sampler splits the data over all 4 ranks: a TP pair reads two batches",
     'num_replicas=mesh["dp"].size(), rank=mesh["dp"].get_local_rank(),', ""),
    ("hsdp.py", "each rank seeds its own model: fully_shard broadcasts nothing",
     "model = tiny.model().to(device)", "model = tiny.model(seed=rank).to(device)"),
]


@pytest.fixture(scope="module")
def runs() -> dict:
    return {}


def _run(runs: dict, name: str):
    if name not in runs:
        runs[name] = run_script((SCRIPTS / name).read_text(), 4, name, quiet=True)
    return runs[name]


@pytest.mark.parametrize("name", ["fsdp_tp.py", "hsdp.py"])
def test_four_ranks_on_a_2d_mesh_equal_one_process(runs, name):
    run = _run(runs, name)
    assert len(run.losses) == len(run.reference_losses) == STEPS, run.output
    worst = max(abs(a - b) for a, b in zip(run.losses, run.reference_losses))
    assert worst <= run.tolerance, f"{name}: {run.losses} vs {run.reference_losses}"
    assert run.losses[-1] < run.losses[0] - 1.0  # it trained


@pytest.mark.parametrize("name,mistake,old,new", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_variant_differs(runs, name, mistake, old, new):
    text = (SCRIPTS / name).read_text()
    assert text.count(old) == 1, f"{name} no longer contains {old!r}: update the variant"
    reference = _run(runs, name).reference_losses
    losses = run_script(text.replace(old, new), 4, name, reference=False, quiet=True).losses
    worst = max(abs(a - b) for a, b in zip(losses, reference))
    assert worst > 1e-3, f"{mistake}: only {worst:.1e} off"
