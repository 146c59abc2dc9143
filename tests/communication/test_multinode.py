"""Chapter 5: the same DDP script on 2 "nodes" (two torchrun agents) equals one process."""
from __future__ import annotations

import os
import re
import subprocess
import warnings

import psutil
import pytest
import torch

from course_lib.communication import multinode
from course_lib.launcher import launch
from course_lib.launcher import torchrun as torchrun_module
from course_lib.communication.multinode import (SCRIPT, netns_available, reference_params,
                                                run_two_nodes, two_namespaces, two_node_commands)
from tests.communicating_less.test_slow_link import recording_pause
from tests.launcher.test_torchrun_store import _refusing_env


def test_two_node_run_equals_one_process(tmp_path):
    """2 nodes x 1 rank with DDP == plain SGD in one process on the same global batches."""
    args = ["--global-batch", "16", "--steps", "3"]
    two = run_two_nodes(args=[*args, "--out", tmp_path / "two.pt"], timeout=180)
    # both agents took part: each printed a "done: world 2" line from its worker
    assert all("done: world 2" in text for text in two.outputs), two.outputs
    ddp, one = torch.load(tmp_path / "two.pt"), reference_params(args)
    assert ddp.keys() == one.keys()
    for key in ddp:
        torch.testing.assert_close(ddp[key], one[key], rtol=1e-5, atol=1e-6)
    start = reference_params([*args[:2], "--steps", "0"])
    assert not torch.allclose(start["fc0.weight"], one["fc0.weight"])  # training moved them


def test_both_nodes_meet_in_one_private_network(tmp_path, monkeypatch):
    """Node 0's agent gets a private network namespace (no other user reaches its stores) and
    node 1's agent joins it; where the kernel refuses, both stay here, after one warning."""
    script = tmp_path / "where.py"
    # one all-reduce before printing: the sum shows the two nodes really talked in that network
    script.write_text("import os, torch, torch.distributed as dist\n"
                      "from course_lib.launcher.torchrun import init_distributed\n"
                      "rank, world = init_distributed()\n"
                      "ranks = torch.tensor([rank]); dist.all_reduce(ranks)\n"
                      "print('network', os.readlink('/proc/self/ns/net'), 'world', world,"
                      " 'sum', int(ranks))\n")
    monkeypatch.setattr(torchrun_module, "_WARNED", [], raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        two = run_two_nodes(script=str(script), timeout=180, allow_shared_loopback=True)
    nets = {re.search(r"network (\S+) world 2 sum 1", text).group(1) for text in two.outputs}
    assert len(nets) == 1, two.outputs
    shared = [w for w in caught if "no private network namespace" in str(w.message)]
    assert (nets == {os.readlink("/proc/self/ns/net")}) == bool(shared), (nets, shared)


WHERE = ("import os, torch, torch.distributed as dist\n"
         "from course_lib.launcher.torchrun import init_distributed\n"
         "rank, world = init_distributed()\n"
         "open(os.path.join({folder!r}, str(rank)), 'w').close()\n"
         "print('network', os.readlink('/proc/self/ns/net'), 'world', world)\n")


def test_where_namespaces_are_refused_no_node_starts_unless_the_learner_opts_in(tmp_path,
                                                                              monkeypatch):
    """Issue 49: no store on the host's loopback by default (what another user could do is said);
    with the opt-in both agents run there, after the warning."""
    script, folder = tmp_path / "where.py", tmp_path / "ran"
    script.write_text(WHERE.format(folder=str(folder)))
    folder.mkdir()
    monkeypatch.delenv(torchrun_module.ALLOW_SHARED_LOOPBACK, raising=False)
    monkeypatch.setenv("PYTHONPATH", _refusing_env(tmp_path)["PYTHONPATH"])
    with pytest.raises(torchrun_module.SharedLoopbackError,
                       match=r"simulated by the test.*list_keys\(\) names every key.*runs code as "
                             r"you.*No node was started.*allow_shared_loopback=True"):
        run_two_nodes(script=str(script), timeout=60)
    assert not list(folder.iterdir()), "a rank ran although the job was refused"
    server = launch._SERVERS._server  # this process's warm rank server, if any
    own = {server.proc.pid} if server is not None and server.alive() else set()
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in own], \
        "the refused run left a process"
    monkeypatch.setenv(torchrun_module.ALLOW_SHARED_LOOPBACK, "1")
    monkeypatch.setattr(torchrun_module, "_WARNED", [])
    with pytest.warns(RuntimeWarning, match="simulated by the test.*list_keys"):
        two = run_two_nodes(script=str(script), timeout=180)
    here = os.readlink("/proc/self/ns/net")
    assert all(f"network {here} world 2" in text for text in two.outputs), two.outputs
    assert sorted(os.listdir(folder)) == ["0", "1"]


def test_the_agents_start_with_the_warm_server_paused(monkeypatch):
    """Issue 50: the agents and their workers import torch themselves; an idle warm server
    beside them only adds to the peak, so they start inside ``server_paused``."""
    seen, paused = [], []

    def launch_(*args, **kwargs):
        seen.append(bool(paused))
        raise RuntimeError("stopped by the test")

    monkeypatch.setattr(multinode, "server_paused", recording_pause(paused))
    monkeypatch.setattr(multinode, "_launch", launch_)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        run_two_nodes()
    assert seen == [True] and not paused


def test_two_node_commands_share_one_rendezvous():
    node0, node1 = two_node_commands(SCRIPT, 2, ["--steps", "1"], port=12345)
    for node, cmd in enumerate((node0, node1)):
        assert "--nnodes=2" in cmd and f"--node-rank={node}" in cmd
        assert "--rdzv-endpoint=127.0.0.1:12345" in cmd and "--nproc-per-node=2" in cmd
        assert cmd.index(SCRIPT) > cmd.index(f"--rdzv-conf=is_host={int(node == 0)}")
        assert cmd[-2:] == ["--steps", "1"]


def test_bad_input_fails_before_any_process(monkeypatch):
    monkeypatch.setattr(multinode, "_launch", lambda *a, **k: pytest.fail("a process started"))
    with pytest.raises(ValueError, match="nprocs_per_node"):
        run_two_nodes(nprocs_per_node=0)
    with pytest.raises(FileNotFoundError):
        run_two_nodes(script="/nonexistent/train.py")


def test_failing_node_is_reported_with_its_output():
    class Ok:
        returncode = 0

    class Failed:
        returncode = 1

    multinode._check([Ok(), Ok()], ["fine", "fine"], "run")  # no error
    with pytest.raises(RuntimeError, match="node 1 exited with code 1\nboom"):
        multinode._check([Ok(), Failed()], ["", "boom"], "run")


def test_namespaces_are_created_and_removed():
    ok, why = netns_available()
    if not ok:
        pytest.skip(f"network namespaces not available here: {why}")
    with two_namespaces(rate_mbit=100) as nodes:
        names = [ns for ns, _, _ in nodes]
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(ns in listed for ns in names)
        qdisc = subprocess.run(["ip", "netns", "exec", names[0], "tc", "qdisc", "show", "dev",
                                nodes[0][1]], capture_output=True, text=True).stdout
        assert "tbf" in qdisc
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in names)
