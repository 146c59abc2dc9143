"""The capstone's training loop, inside one rank: any layout of chapter 09, real data, eval,
checkpoints that resume (and reshard), faults on purpose, the peak of one step.

:func:`train_rank_capstone` runs unchanged inside :func:`course_lib.run` (``train_gpt``, the notebook's
face) and in ``course_lib/capstone/train_gpt.py`` under torchrun. The model comes from chapter
09's builders (``build_2d``: DDP, FSDP2, TP, FSDP2 × TP; ``build_pp``: two stages), the data
order from :class:`~course_lib.capstone.data.DataOrder`, checkpoints from chapter 06's protocol
(DCP shards, a commit marker last; data position and loss history in the manifest). The loss
per step is the global batch's mean (one all-reduce): every layout reports one process's number.
:func:`peak_step`: chapter 01's tracker (CPU) or ``max_memory_allocated`` (GPU) on the second
step. The device and backend are :func:`course_lib.launcher.devices.place`'s choice.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from course_lib.capstone.data import DataOrder, Windows, split_corpus, val_batch
from course_lib.common.models import GPT, GPTConfig
from course_lib.communication.formulas import fit_alpha_beta
from course_lib.communication.benchmark import bench_rank
from course_lib.common.training import make_optimizer
from course_lib.composition.compose import build_2d, dense_params, state_bytes
from course_lib.composition.layout import Layout
from course_lib.composition.measure import quiet_dtensor_notes
from course_lib.composition.pipeline import build_pp, pp_dense_names, pp_step
from course_lib.composition.predict import slowest
from course_lib.fault_tolerance.checkpoint import resume_latest, save_checkpoint
from course_lib.fault_tolerance.faults import Fault, fire
from course_lib.common.deprecation import renamed, warn_renamed
from course_lib.launcher import progress
from course_lib.launcher.devices import place
from course_lib.memory.report import categorize

__all__ = ["build", "train_rank_capstone", "matmul_peak", "machine_constants", "rank_entry",
           "peak_step", "VAL_SEQUENCES", "LINK_SIZES"]

VAL_SEQUENCES = 8  # the fixed validation batch: the first 8 windows of the validation split


def pick_device(requested: str = "auto", cuda_available: bool | None = None,
                pipeline: bool = False) -> tuple[str, str]:
    """Deprecated (issue 51): ``(device, backend)`` of :func:`course_lib.launcher.devices.place`
    for this node's ranks (``LOCAL_WORLD_SIZE``, default 1)."""
    warn_renamed("course_lib.capstone.train.pick_device", "course_lib.launcher.devices.place")
    gpus = None if cuda_available is None else int(cuda_available)
    p = place(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), None, requested, pipeline=pipeline,
              gpus=gpus)
    return p.device, p.backend


def build(config: GPTConfig, layout: Layout, seed: int, device: str = "cpu") -> dict:
    """This rank's model for ``layout`` (one rank: the plain GPT) and its place in the data."""
    layout.device_for(device)  # a pipeline on a GPU: a ValueError
    if layout.pp > 1:
        return {"kind": "pp", **build_pp(config, layout, seed)}
    if layout.world == 1:
        torch.manual_seed(seed)
        return {"kind": "single", "model": GPT(config).to(device), "dp_index": 0, "dp_size": 1}
    _, model, dp_index, dp_size = build_2d(config, layout, seed, device=device)
    return {"kind": "2d", "model": model, "dp_index": dp_index, "dp_size": dp_size}


def _loss(b: dict, config: GPTConfig, x: torch.Tensor, y: torch.Tensor, backward: bool):
    """This rank's loss on its batch (pipeline: the last stage's, sent back to the first)."""
    if b["kind"] == "pp":
        return pp_step(b, config, x, y, backward=backward)
    loss = GPT.loss(b["model"](x), y)
    if backward:
        loss.backward()
    return loss


def _global_mean(loss: torch.Tensor) -> float:
    """The global batch's mean loss: every rank of a data-parallel group holds the same value,
    so the mean over all ranks is the mean over data-parallel ranks."""
    loss = loss.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return loss.item()


def _dense(b: dict, config: GPTConfig, layout: Layout) -> dict[str, torch.Tensor]:
    """Every parameter in full, named as in the dense GPT (a collective on sharded layouts)."""
    model = getattr(b["model"], "module", b["model"])  # DDP names them "module.<name>"
    params = dense_params(model, config, layout.tp)
    return pp_dense_names(params, b) if b["kind"] == "pp" else params


def _reshard(model: torch.nn.Module) -> None:
    """Free what a forward without backward left gathered: FSDP2 keeps the root's parameters
    unsharded after its forward (backward would need them next), an eval leaves them so."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def peak_step(step, model: torch.nn.Module, optimizer, batch: tuple) -> tuple[object, int]:
    """``step()``'s result and the bytes alive at its peak: on the CPU chapter 01's tracker
    (model, optimizer, batch and everything the step creates), on a GPU the CUDA allocator's
    ``max_memory_allocated`` (every tensor of this process)."""
    device = batch[0].device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        out = step()
        return out, torch.cuda.max_memory_allocated(device)
    from course_lib.memory.tracker import GlobalMemTracker  # ranks only: imports torch._dynamo
    tracker = GlobalMemTracker()
    tracker.track_external(model, optimizer, *batch)
    with tracker:
        out = step()
    return out, sum(categorize(tracker.get_tracker_snapshot("peak")).values())


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to /dev/null (kineto prints a USDT line at every profiler start and
    stop, from C++): only around those two calls, never around the learner's step."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved), os.close(null)


def _profiled(step_fn, step: int, path: str | None) -> torch.Tensor:
    """``step_fn()`` under ``torch.profiler`` (CPU ops), its trace written to ``path`` (if any)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    if path is None:  # the other ranks run the same step unprofiled: the collectives still meet
        return step_fn()
    prof = profile(activities=[ProfilerActivity.CPU])
    with _quiet_stderr():
        prof.start()
    try:
        with record_function(f"ProfilerStep#{step}"):
            out = step_fn()
    finally:
        with _quiet_stderr():
            prof.stop()
    prof.export_chrome_trace(path)
    return out


def _check_meta(layout: Layout, steps: int):
    def check(manifest: dict) -> None:
        meta = manifest["meta"]
        if not (type(meta.get("losses")) is list and len(meta["losses"]) == manifest["step"]):
            raise ValueError("meta has no loss history of one loss per step")
        if meta.get("tp", 1) != layout.tp:  # TP reorders the qkv rows (chapter 4)
            raise ValueError(f"saved with tp={meta.get('tp', 1)}: its qkv rows are in another "
                             f"order than tp={layout.tp} expects")
        if manifest["step"] > steps:
            raise ValueError(f"saved at step {manifest['step']}, past this run's {steps} steps")
    return check


def train_rank_capstone(config: GPTConfig, layout: Layout, steps: int, *,
                        batch_size: int, lr: float, seed: int = 0, eval_every: int = 0,
                        ckpt_dir: str | None = None, every: int = 0, keep: int | None = 2, faults: tuple[Fault, ...] = (),
                        attempt: int | None = None, threads: int = 1, return_params: bool = True,
                        device: str = "cpu", trace: str | None = None) -> dict:
    """Train ``steps`` Adam steps of ``batch_size`` sequences per data-parallel rank.

    Resumes from the newest checkpoint in ``ckpt_dir`` that loads (any data-parallel layout
    with the same ``tp``: DCP reshards); saves one every ``every`` steps. Returns this rank's
    ``losses`` (global mean per step), ``val_losses`` ([step, loss] every ``eval_every`` steps
    and at the end), ``bytes`` (model states as stored), ``peak`` (bytes at the peak of the
    second step this process runs; ``None`` if it runs one), ``step_seconds`` (of the other
    steps: the tracker slows that one), ``resumed_from``, and ``params`` (full, dense names;
    sent by the first rank of each pipeline stage, ``{}`` from the others, which hold the same).
    ``trace``: a file name; rank 0 profiles its third step (``torch.profiler``) and writes the
    Chrome trace there (the step is then left out of ``step_seconds``)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    if attempt is None:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    mine = {(f.step, f.kind): f for f in faults if f.attempt == attempt and f.rank == rank}
    torch.set_num_threads(threads)  # the same float work under run and under torchrun
    quiet_dtensor_notes()  # DTensor's note on gathering 2-D shards, once per rank
    b = build(config, layout, seed, device)
    model = b["model"]
    optimizer = make_optimizer(model.parameters(), "adam", lr=lr)
    train_tokens, val_tokens = split_corpus()
    order = DataOrder(Windows(train_tokens, config.seq_len), batch_size, b["dp_index"],
                      b["dp_size"], seed)
    vx, vy = (t.to(device) for t in val_batch(val_tokens, config.seq_len, VAL_SEQUENCES,
                                              b["dp_index"], b["dp_size"]))
    start, losses, val_losses, resumed = 0, [], [], None
    if ckpt_dir:
        state = resume_latest(ckpt_dir, model, optimizer, check_meta=_check_meta(layout, steps))
        if state is not None:
            start = resumed = state["step"]
            meta = state["meta"]
            losses, val_losses = list(meta["losses"]), [list(v) for v in meta["val_losses"]]
            order.restore(meta["data"])
    seconds, peak = [], None
    for step in range(start, steps):
        for kind in ("kill", "raise"):
            if (step, kind) in mine:
                fire(mine[step, kind])
        t0 = time.perf_counter()
        x, y = (t.to(device) for t in order.next_batch())

        def one_step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            out = _loss(b, config, x, y, backward=True)
            optimizer.step()
            return out
        if step == start + 1:  # the second step: Adam's states exist, DDP builds its buckets
            loss, peak = peak_step(one_step, model, optimizer, (x, y))
            losses.append(_global_mean(loss))  # not timed: the tracker slows the step
        elif trace and step == start + 2:
            losses.append(_global_mean(_profiled(one_step, step, trace if rank == 0 else None)))
        else:
            losses.append(_global_mean(one_step()))
            seconds.append(time.perf_counter() - t0)
        done = step + 1
        if eval_every and (done % eval_every == 0 or done == steps):
            with torch.no_grad():
                val_losses.append([done, _global_mean(_loss(b, config, vx, vy, backward=False))])
            _reshard(model)
        if rank == 0:
            progress.report(done, steps)
        if ckpt_dir and every and done % every == 0:
            hook = mine.get((done, "save"))
            meta = {"losses": losses, "val_losses": val_losses, "data": order.state(),
                    "seed": seed, "tp": layout.tp, "layout": layout.sizes()}
            save_checkpoint(ckpt_dir, done, model, optimizer, meta=meta, keep=keep,
                            before_commit=(lambda f=hook: fire(f)) if hook else None)
    out = {"rank": rank, "losses": losses, "val_losses": val_losses, "resumed_from": resumed,
           "bytes": state_bytes(model, optimizer), "peak": peak, "step_seconds": seconds,
           "stage": b.get("stage"), "attempt": attempt}
    dense = _dense(b, config, layout) if return_params else None  # gathered: every rank takes part
    first_of_stage = rank % (layout.world // layout.pp) == 0  # the others hold the same tensors
    out["params"] = dense if first_of_stage or dense is None else {}
    return out


def matmul_peak(n: int = 512, repeats: int = 5, device: str = "cpu") -> float:
    """This process's best fp32 matmul rate in FLOP/s (``2 n³`` per ``n × n`` product), best of
    ``repeats``: the peak MFU is measured against, on the threads (or the GPU) it has."""
    a, c = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    a @ c  # warm-up: first-call allocations
    best = math.inf
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ c
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


LINK_SIZES = (2**10, 2**14, 2**18, 2**20, 2**23)  # all-reduce sizes the α-β fit sees, 1 KiB-8 MiB


def machine_constants(device: str = "cpu") -> dict:
    """Inside a rank, on every rank: this process's ``matmul_peak`` and ``link``, the α and β
    chapter 05 fits to all-reduces of ``LINK_SIZES`` among all ranks (``None`` alone)."""
    out = {"matmul_peak": matmul_peak(device=device), "link": None}
    if dist.is_initialized() and dist.get_world_size() > 1:
        rows = bench_rank(["all_reduce"], list(LINK_SIZES), None, 1)
        fit = fit_alpha_beta([(dist.get_world_size(), n, t) for _, n, t, _ in rows])
        out["link"] = (fit.alpha, fit.beta)
    return out


def rank_entry(config, layout, steps, kwargs, work: list | None = None) -> dict:
    """What ``train_gpt`` ships to each rank: this machine's constants, measured before the
    first step for the MFU and, with ``work`` (every rank's
    :func:`~course_lib.composition.predict.rank_work`), the step-time prediction
    (``step_predicted``: the slowest rank's); then training."""
    constants = machine_constants(kwargs.get("device", "cpu"))
    predicted = {"step_predicted": slowest(work, constants)} if work else {}
    return {**predicted, **train_rank_capstone(config, layout, steps, **kwargs), **constants}


# names before issue 51 (``train_rank`` named three loops; the device choice is the launcher's)
__getattr__ = renamed(__name__, {"train_rank": "train_rank_capstone",
                                 "DEVICE_CHOICES": "course_lib.launcher.devices.DEVICE_CHOICES"})
