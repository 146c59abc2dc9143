"""benchmarks/gpu_reference.py: importable without a GPU, and its CPU dry run (gloo, tiny sizes)
goes through every experiment and writes a file that show_published reads back."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from course_lib.common.published import GPU_REFERENCE_PATH, gpu_reference

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_reference.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_measures_every_experiment_and_writes_only_where_told(bench, tmp_path, capsys):
    before = GPU_REFERENCE_PATH.exists()
    out = tmp_path / "ref.json"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    assert GPU_REFERENCE_PATH.exists() == before          # the notebooks' file is never a CPU run
    data = json.loads(out.read_text())
    assert data["meta"]["dry_run"] is True and data["meta"]["gpu"].startswith("none")
    exp = data["experiments"]
    assert {"compute_s", "comm_s", "step_overlapped_s", "step_serial_s"} <= exp["overlap"].keys()
    assert all(exp["overlap"][k] > 0 for k in ("compute_s", "comm_s"))
    assert set(exp["scaling"]["step_s"]) == {"1", "2"} and exp["scaling"]["speedup"] > 0
    rows = exp["bubble"]["rows"]
    assert [(r["schedule"], r["m"]) for r in rows] == [(s, m) for s in ("gpipe", "1f1b")
                                                       for m in (1, 2, 4, 8)]
    assert all(0 < r["bubble"] < 1 for r in rows)
    assert gpu_reference("bubble", out)["result"]["lines"] == exp["bubble"]["lines"]
    assert "bubble measured" in capsys.readouterr().out


def test_without_two_gpus_it_says_so_and_writes_nothing(bench, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench.torch.cuda, "device_count", lambda: 0)
    assert bench.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "needs 2 CUDA GPUs" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
