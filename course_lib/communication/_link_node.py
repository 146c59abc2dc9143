"""What each node of :func:`course_lib.communication.link_sweep.link_sweep` runs: one phase.

:func:`sweep_phase` is the target the sweep hands to
:func:`course_lib.launcher.shaped_link.run_pair` (the course's one hub for shaped links), once per
(link setting, strategy): a training step of DDP or FSDP2 timed after a warm-up, beside the same
step without communication, and the bytes this node's end of the veth sent meanwhile. The GPU path runs
:func:`strategy_phase` in plain ranks of ``course_lib.run`` (no namespace, no wire counter).
"""
from __future__ import annotations

import os
import statistics
import time

from course_lib.launcher.netns import tx_bytes


def _batch(sizes, batch, seed, rank, device):
    import torch
    gen = torch.Generator().manual_seed(seed + 1000 * rank)
    return (torch.randn(batch, sizes[0], generator=gen).to(device),
            torch.randn(batch, sizes[-1], generator=gen).to(device))


def _timed(model, opt, data, device) -> float:
    """Seconds of one :func:`_step`, the GPU's queue drained (on a GPU)."""
    start = time.perf_counter()
    _step(model, opt, data, device)
    return time.perf_counter() - start


def compute_phase(sizes, batch, steps, seed, device="cpu") -> dict:
    """Median seconds of a local training step (plain model, SGD, this rank's batch): no comm."""
    import torch
    from course_lib.common.models import MLP
    torch.manual_seed(seed)
    model = MLP(sizes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = _batch(sizes, batch, seed, 0, device)
    times = [_timed(model, opt, data, device) for _ in range(steps + 1)]  # the first: warm-up
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


def _step(model, opt, data, device) -> None:
    import torch
    import torch.nn.functional as F

    opt.zero_grad(set_to_none=True)
    F.mse_loss(model(data[0]), data[1]).backward()
    opt.step()
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


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
        _step(model, opt, data, device)  # warm-up: DDP builds its buckets, FSDP2 initialises lazily
    else:
        model, opt, data, counted = kept
    dist.barrier()
    before = tx_bytes(iface) if iface else None
    times = []
    for _ in range(steps):
        dist.barrier()
        times.append(_timed(model, opt, data, device))
    dist.barrier()
    sent = tx_bytes(iface) - before if iface else None
    if kept is None:
        with CommCounter() as counter:
            _step(model, opt, data, device)
        dist.barrier()
        counted = {"calls": counter.calls_by_type(), "payload": counter.bytes_by_type()}
        if cache is not None:
            cache[strategy] = (model, opt, data, counted)
    return {"times": times, "compute_s": compute, "tx": sent, **counted}


def sweep_phase(strategy, sizes, batch, steps, cache: dict) -> dict:
    """:func:`strategy_phase` on a node of the shaped link (seed 0), counting the bytes its end
    of the veth (gloo's interface) sends."""
    return strategy_phase(strategy, sizes, batch, steps, 0,
                          iface=os.environ["GLOO_SOCKET_IFNAME"], cache=cache)
