"""Chapter 09's script (course_lib/scripts/mesh_2d.py: FSDP2 × TP, then HSDP) under the real
torchrun on 4 CPU ranks equals one process; each broken variant, the mistake a learner makes, is
seen failing.

Run through ``%%torchrun``'s own function, ``script_magic.run_script`` (tolerance 1e-4: float32
sums in another order). A broken variant must differ from one process by more than 10× that at
some step.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from course_lib.launcher.script_magic import run_script

SCRIPTS = Path(__file__).resolve().parents[2] / "course_lib" / "scripts"
STEPS = 16  # tiny.STEPS for each of the two layouts

BROKEN = [
    ("mesh_2d.py", "the data split over all 4 ranks: a TP pair reads two batches",
     'train(model, mesh["dp"].get_local_rank(), mesh["dp"].size(), step=0)',
     "train(model, rank, world, step=0)"),
    ("mesh_2d.py", "each rank seeds its own HSDP model: fully_shard broadcasts nothing",
     "model = tiny.model().to(device)", "model = tiny.model(seed=rank).to(device)"),
]


@pytest.fixture(scope="module")
def runs() -> dict:
    return {}


def _run(runs: dict, name: str):
    if name not in runs:
        runs[name] = run_script((SCRIPTS / name).read_text(), 4, name, quiet=True)
    return runs[name]


@pytest.mark.parametrize("name", ["mesh_2d.py"])
def test_four_ranks_on_a_2d_mesh_equal_one_process(runs, name):
    run = _run(runs, name)
    assert len(run.losses) == len(run.reference_losses) == STEPS, run.output
    worst = max(abs(a - b) for a, b in zip(run.losses, run.reference_losses))
    assert worst <= run.tolerance, f"{name}: {run.losses} vs {run.reference_losses}"
    assert run.losses[-1] < run.losses[0] - 1.0  # it trained


@pytest.mark.parametrize("name,mistake,old,new", BROKEN, ids=["tp_pair_data", "hsdp_seeds"])
def test_a_broken_variant_differs(runs, name, mistake, old, new):
    text = (SCRIPTS / name).read_text()
    assert text.count(old) == 1, f"{name} no longer contains {old!r}: update the variant"
    reference = _run(runs, name).reference_losses
    losses = run_script(text.replace(old, new), 4, name, reference=False, quiet=True).losses
    worst = max(abs(a - b) for a, b in zip(losses, reference))
    assert worst > 1e-3, f"{mistake}: only {worst:.1e} off"
