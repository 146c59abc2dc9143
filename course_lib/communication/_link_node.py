"""The processes behind :func:`course_lib.communication.link_sweep.link_sweep`: a hub, two nodes.

The hub (``python -m course_lib.communication._link_node hub``, started by ``link_sweep`` under
``unshare --net``, plus ``--user --map-root-user`` for a normal user) reads the sweep's
parameters as one JSON line on stdin, starts two nodes, each under ``unshare --net`` in a
network namespace of its own, joins them with a veth pair (10.99.0.1 and 10.99.0.2), shapes both
ends with ``tc``, and drives the phases: the unthrottled link (first and last) and every
requested setting, one phase per strategy; each result goes back as a JSON line on stdout.
A node holds its namespace: when it exits, the namespace and its veth end vanish. Both kinds of
process die with their parent (``PR_SET_PDEATHSIG``), so a killed kernel leaves none behind.
The mechanics (namespaces, veth, ``tc``, the node processes) live in
:mod:`course_lib.launcher.netns`, shared with chapter 02's overlap measurement.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from course_lib.launcher.netns import (  # noqa: F401 - the mechanics, kept importable here
    ADDRS, Nodes, _in, _sh, die_with_parent, shape, tx_bytes, wire)

_Nodes = Nodes

def _batch(sizes, batch, seed, rank, device):
    import torch
    gen = torch.Generator().manual_seed(seed + 1000 * rank)
    return (torch.randn(batch, sizes[0], generator=gen).to(device),
            torch.randn(batch, sizes[-1], generator=gen).to(device))


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def compute_phase(sizes, batch, steps, seed, device="cpu") -> dict:
    """Median seconds of a local training step (plain model, SGD, this rank's batch): no comm."""
    import torch
    from course_lib.common.models import MLP
    torch.manual_seed(seed)
    model = MLP(sizes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = _batch(sizes, batch, seed, 0, device)
    times = []
    for _ in range(steps + 1):  # the first is a warm-up
        start = time.perf_counter()
        _step(model, opt, data)
        _sync(device)
        times.append(time.perf_counter() - start)
    return {"compute_s": statistics.median(times[1:])}


def wrap(model, strategy: str, device):
    """DDP, or FSDP2 (ZeRO-3), with SGD: :func:`course_lib.sharding.strategies.wrap`'s ``"ddp"`` and
    ``"fsdp"`` for an MLP, without importing its other strategies into every node (seconds)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel
    if strategy == "ddp":
        ids = None if device.index is None else [device.index]  # cuda:i; None on CPU
        model = DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
    elif strategy != "fsdp":
        raise ValueError(f"unknown strategy {strategy!r}: the link sweep runs 'ddp' or 'fsdp'")
    else:  # the mesh on the model's device: FSDP2's default follows the accelerator, if any
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for unit in model.children():
            if any(True for _ in unit.parameters()):
                fully_shard(unit, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model, opt, data) -> None:
    import torch.nn.functional as F

    opt.zero_grad(set_to_none=True)
    F.mse_loss(model(data[0]), data[1]).backward()
    opt.step()


def strategy_phase(strategy, sizes, batch, steps, seed, iface=None, device="cpu",
                   cache: dict | None = None) -> dict:
    """Time ``steps`` steps of ``strategy`` after a warm-up; bytes sent on ``iface`` meanwhile.

    First the same steps without communication (:func:`compute_phase`), just before, under the
    same load. Each timed step starts after a barrier, so it is how long this rank needed from
    a common start. ``tx`` is the interface's transmit counter over the timed steps (every byte
    this node put on the wire: payload, TCP/IP headers, acknowledgements, the barriers); one
    more step, untimed, is seen by :class:`~course_lib.sharding.comm_counter.CommCounter` for the payload.
    With a ``cache`` (a node's dict, across phases) model, warm-up and payload count happen once
    per strategy; later phases on a re-shaped link run only the timed steps.
    """
    import torch
    import torch.distributed as dist
    from course_lib.sharding.comm_counter import CommCounter
    from course_lib.common.models import MLP
    device = torch.device(device)
    compute = compute_phase(sizes, batch, steps, seed, device)["compute_s"]
    kept = (cache or {}).get(strategy)
    if kept is None:
        torch.manual_seed(seed)
        model, opt = wrap(MLP(sizes).to(device), strategy, device)
        data = _batch(sizes, batch, seed, dist.get_rank(), device)
        _step(model, opt, data)  # warm-up: DDP builds its buckets, FSDP2 initialises lazily
        _sync(device)
    else:
        model, opt, data, counted = kept
    dist.barrier()
    before = tx_bytes(iface) if iface else None
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        _step(model, opt, data)
        _sync(device)
        times.append(time.perf_counter() - start)
    dist.barrier()
    sent = tx_bytes(iface) - before if iface else None
    if kept is None:
        with CommCounter() as counter:
            _step(model, opt, data)
            _sync(device)
        dist.barrier()
        counted = {"calls": counter.calls_by_type(), "payload": counter.bytes_by_type()}
        if cache is not None:
            cache[strategy] = (model, opt, data, counted)
    return {"times": times, "compute_s": compute, "tx": sent, **counted}


def node_main() -> None:
    """One node: wait for the hub to wire the namespace, join the group, run phases on demand."""
    die_with_parent()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    import torch  # while the hub wires the namespace
    import torch.distributed as dist
    import torch.distributed.fsdp  # noqa: F401
    import course_lib.sharding.comm_counter  # noqa: F401
    setup = json.loads(sys.stdin.readline())
    os.environ["GLOO_SOCKET_IFNAME"] = setup["iface"]
    torch.set_num_threads(setup["threads"])
    dist.init_process_group("gloo", init_method=setup["init"], rank=setup["rank"], world_size=2)
    print(json.dumps({"joined": setup["rank"]}), flush=True)
    models: dict = {}  # per strategy, built and warmed up by its first (untimed) phase
    for line in sys.stdin:
        job = json.loads(line)
        if job["phase"] == "stop":
            break
        out = strategy_phase(job["phase"], setup["sizes"], setup["batch"], job["steps"],
                             setup["seed"], iface=setup["iface"], cache=models)
        print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # gloo threads may abort a normal interpreter shutdown


def hub_main() -> None:
    """Build the two-node network, run every phase, print one JSON line per result."""
    die_with_parent()
    opts = json.loads(sys.stdin.readline())
    start, tag = time.monotonic(), os.getpid()
    nodes = Nodes("course_lib.communication._link_node")
    try:
        pids = [reply["ready"] for reply in nodes.receive()]
        ifaces = wire(pids, tag)
        for rank, iface in enumerate(ifaces):
            nodes.send(rank, {"rank": rank, "iface": iface, "init": opts["init"],
                              "sizes": opts["sizes"], "batch": opts["batch"], "seed": 0,
                              "threads": opts["threads"]})
        nodes.receive()
        print(json.dumps({"joined_s": time.monotonic() - start}), flush=True)
        for strategy in opts["strategies"]:  # imports, build, warm-up, payload count: not kept
            nodes.ask({"phase": strategy, "steps": 1})
        settings = list(dict.fromkeys([(0, 0)] + [(r, opts["latency_ms"]) for r in opts["rates"]]))
        if len(settings) > 1:  # the unthrottled base again at the end: load only adds time
            settings.append((0, 0))
        for rate, latency in settings:
            for pid, iface in zip(pids, ifaces):
                shape(pid, iface, rate, latency)
            for strategy in opts["strategies"]:
                ranks = nodes.ask({"phase": strategy, "steps": opts["steps"]})
                print(json.dumps({"rate_mbit": rate, "latency_ms": latency, "strategy": strategy,
                                  "ranks": ranks, "at_s": time.monotonic() - start}),
                      flush=True)
        for rank in range(2):
            nodes.send(rank, {"phase": "stop"})
        for proc in nodes.procs:
            proc.wait(30)
    finally:
        nodes.close()


if __name__ == "__main__":
    {"hub": hub_main, "node": node_main}[sys.argv[1]]()
