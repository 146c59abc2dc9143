"""Chapter 10 §6, the settings people export, where a gloo/torch twin runs on CPU ranks:
``GLOO_SOCKET_IFNAME`` is read when a gloo group is created (a wrong name fails on every rank,
naming it); the Flight Recorder records gloo collectives by default, 2,000 of them, and
``TORCH_FR_BUFFER_SIZE=0`` turns it off; ``TORCH_CPP_LOG_LEVEL=INFO`` with
``TORCH_DISTRIBUTED_DEBUG=INFO`` makes every rank's DDP log its set-up under the real torchrun,
and without them nothing of it is printed."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import course_lib.scripts
from course_lib.launcher.launch import run
from course_lib.launcher.torchrun import torchrun

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def _meets_over(names):  # the notebook's cell, returning what it prints
    seen = []
    for name in names:
        os.environ["GLOO_SOCKET_IFNAME"] = name
        try:
            group = dist.new_group(backend="gloo")
            t = torch.ones(2)
            dist.all_reduce(t, group=group)
            seen.append((name, t.tolist()))
        except RuntimeError as err:
            seen.append((name, str(err).split(". ")[-1]))
    return seen


def test_gloo_socket_ifname_is_read_when_a_group_is_created():
    r0, r1 = run(_meets_over, 2, ["eth-typo", "lo"])
    assert r0 == r1 == [("eth-typo", "Unable to find address for: eth-typo"), ("lo", [2.0, 2.0])]


def _recorded(calls):
    t = torch.ones(1)
    for _ in range(calls):
        dist.all_reduce(t)
    return len(pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["entries"])


def test_the_flight_recorder_keeps_2000_gloo_collectives_by_default_and_0_turns_it_off(monkeypatch):
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    assert run(_recorded, 2, 2010) == [2000, 2000]
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert run(_recorded, 2, 3) == [0, 0]


def test_ddp_reports_its_set_up_with_the_two_log_variables_under_torchrun(monkeypatch):
    for name in ("TORCH_CPP_LOG_LEVEL", "TORCH_DISTRIBUTED_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    script = str(Path(course_lib.scripts.__file__).with_name("ddp.py"))
    silent = torchrun(script, 2, quiet=True).output
    loud = torchrun(script, 2, quiet=True, env={"TORCH_CPP_LOG_LEVEL": "INFO",
                                                "TORCH_DISTRIBUTED_DEBUG": "INFO",
                                                "GLOO_SOCKET_IFNAME": "lo"}).output
    assert "DDP Initialized with" not in silent
    for rank in (0, 1):
        mine = [line for line in loud.splitlines() if line.startswith(f"[rank {rank}] ")]
        assert any("DDP Initialized with" in line for line in mine), loud[-2000:]
        for field in ("backend_name: gloo", "gloo_socket_ifname: lo", "world_size: 2",
                      "bucket_cap_bytes: 26214400"):
            assert f"[rank {rank}] {field}" in mine, field


def _section_6() -> str:
    import json
    nb = Path(__file__).resolve().parents[2] / "notebooks" / "10_debugging.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
             if c["cell_type"] == "markdown"]
    start = next(i for i, c in enumerate(cells) if c.startswith("## 6 · The settings people export"))
    end = next(i for i, c in enumerate(cells) if c.startswith("## 7 "))
    return "\n".join(cells[start:end])


def test_every_torch_nccl_variable_of_the_table_is_in_the_installed_headers():
    import re
    c10d = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" / "c10d"
    nccl = (c10d / "ProcessGroupNCCL.hpp").read_text()
    recorder = (c10d / "FlightRecorder.hpp").read_text()
    named = set(re.findall(r"TORCH_(?:NCCL|FR)_[A-Z_]+[A-Z]", _section_6()))
    assert {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_DUMP_ON_TIMEOUT",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_FR_BUFFER_SIZE"} <= named
    for name in named:
        assert f'"{name}"' in nccl + recorder, name
    # the defaults the table states
    assert "the default value (3 - SkipCleanUp)" in nccl
    assert "kProcessGroupNCCLDefaultTimeout =\n    std::chrono::milliseconds(10 * 60 * 1000)" in nccl
    assert '{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)' in recorder
