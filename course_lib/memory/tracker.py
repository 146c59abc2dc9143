"""Measure where training memory goes, with torch's own allocation tracker (chapter 01).

Real training steps run under ``torch.distributed._tools.mem_tracker.MemTracker``, which sees
every tensor storage created and freed and files it under params, buffers, grads, optimizer
states, activations (created in forward) or temporaries (created in backward). No byte count
here comes from a formula: those live in :mod:`course_lib.memory.predict`, compared with these.
:func:`measure_step` is the entry point (``fake=True``: the same steps on fake tensors, a 7B
model on a laptop); :func:`tracked_steps` the loop, reused inside distributed ranks with another
tracker (e.g. ``FSDPMemTracker``); :func:`measure_inference` one forward under ``no_grad``.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import psutil
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

from course_lib.common.checks import batch_shape
from course_lib.common.models import GPT, GPTConfig, get_config, param_count
from course_lib.common.training import default_loss, make_optimizer
from course_lib.memory import predict
from course_lib.memory.predict import flow_bytes  # its home: the formula (sharding's pre-check reads it)
from course_lib.memory.census import census
from course_lib.memory.mixed import MixedPrecisionAdam
from course_lib.memory.report import MemoryReport, STATE_KEYS, categorize, format_bytes

__all__ = ["measure_step", "measure_inference", "tracked_steps", "make_optimizer", "default_loss",
           "GlobalMemTracker", "flow_bytes"]

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_DTYPE = {"fp32": torch.float32, "amp": torch.float32, "bf16": torch.bfloat16,
          "mixed": torch.bfloat16, "mixed-fp32-grads": torch.bfloat16}


class _NoHook:
    """Stands in for a gradient-hook handle on a frozen parameter (nothing to remove)."""

    def remove(self) -> None:
        pass


class GlobalMemTracker(MemTracker):
    """``MemTracker`` that keeps only the global "current" and "peak" snapshots (much faster:
    chapter 01 reads only those), and that gives a frozen parameter a do-nothing gradient-hook
    handle instead of a hook (it never gets a gradient; it still counts under params).
    """

    def _track_module_params_and_buffers(self, module: nn.Module,
                                         install_grad_hooks: bool = True) -> tuple[int, int]:
        for p in module.parameters():
            if not p.requires_grad:
                self._param_to_grad_hook_handles.setdefault(p, (_NoHook(), _NoHook()))
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def track_grads(self, tensors: list[torch.Tensor]) -> None:
        """Count tensors kept outside ``p.grad`` (e.g. fp32 gradient accumulators) as gradients."""
        for t in tensors:
            self._update_and_maybe_create_winfos(t, _MemRefType.GRAD)

    def _update_peak_stats(self, peak_state: object) -> None:
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                self._peak_mem[dev] = dev_snap["Total"]
                self._peak_mem_snap[dev] = dict(dev_snap)


def tracked_steps(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, *,
                  loss_fn: LossFn | None = None, tracker: MemTracker | None = None,
                  iterations: int = 2, autocast_dtype: torch.dtype | None = None) -> MemoryReport:
    """Run ``iterations`` training steps under ``tracker`` and report the last (steady) one.

    The steps are chapter 1's :func:`~course_lib.memory.census.census`: ``zero_grad(set_to_none=True)``,
    forward + loss (under autocast when ``autocast_dtype`` is set), backward, ``optimizer.step()``,
    a "current" snapshot after every phase. Without ``tracker`` a fresh ``GlobalMemTracker`` is made and the model,
    optimizer and batch are registered with it; a given tracker (e.g. ``FSDPMemTracker(model,
    optimizer)`` in chapter 3) must already know them. On a GPU the report adds
    ``cuda_max_allocated``; note the tracker rounds every CUDA storage up to 512 bytes, so small
    tensors count a little more there than on the CPU, where formulas match to the byte.
    """
    if iterations < 2:
        raise ValueError("iterations must be >= 2: optimizer states appear in the first step")
    inputs, targets = batch
    device = next(model.parameters()).device
    if tracker is None:
        tracker = GlobalMemTracker()
        tracker.track_external(model, optimizer, inputs, targets)
        tracker.track_grads(getattr(optimizer, "grad_buffers", []))
    on_cuda = device.type == "cuda" and not isinstance(inputs, FakeTensor)
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    snapshots, peak_snapshot = census(model, optimizer, batch, loss_fn or default_loss, tracker,
                                      iterations, autocast_dtype)
    timeline = [(phase, categorize(snapshot)) for phase, snapshot in snapshots]
    peak = categorize(peak_snapshot)
    after_step, after_forward = timeline[-1][1], timeline[-3][1]
    measured = {key: after_step[key] for key in STATE_KEYS}
    measured["model_states"] = sum(measured.values())
    measured.update(activations=after_forward["activations"], temporaries=peak["temporaries"],
                    inputs=after_step["inputs"], peak=sum(peak.values()))
    if on_cuda:  # the caching allocator's own count, for comparison with the tracker's peak
        measured["cuda_max_allocated"] = torch.cuda.max_memory_allocated(device)
    info: dict = {"device": str(device)}
    n_params = sum(p.numel() for p in model.parameters())
    return MemoryReport(measured, timeline, peak, n_params, info)


def measure_step(model: nn.Module | GPTConfig | str, batch: Batch | tuple[int, int], *,
                 loss_fn: LossFn | None = None, optimizer: str = "adam", precision: str = "fp32",
                 fake: bool = False, iterations: int = 2, seed: int = 0,
                 recompute: str = "none") -> MemoryReport:
    """Measure one steady-state training step, per memory category.

    ``model`` is a module with its ``batch = (inputs, targets)``, or a :class:`GPTConfig` /
    preset name with ``batch = (batch_size, seq_len)``: the GPT (seeded with ``seed``) and random
    tokens are then built here, after checking they fit. ``precision``: ``"fp32"``; ``"amp"``
    (autocast to bf16, fp32 weights); ``"bf16"`` (weights, grads and optimizer states in bf16 — a
    given module must already be bf16); ``"mixed"`` (bf16 weights and grads, fp32 master weights
    and moments in :class:`~course_lib.memory.mixed.MixedPrecisionAdam`: 16 B/param) and
    ``"mixed-fp32-grads"`` (plus fp32 gradient accumulators: 20 B/param), Adam/AdamW only. ``fake=True`` (config only) runs on fake tensors and
    allocates nothing. Raises ``ValueError`` for bad choices and ``MemoryError`` when a real run
    would not fit in free RAM — both before allocating. ``recompute`` (a GPT only): ``"none"``,
    ``"selective"`` (checkpoint the attention core) or ``"full"`` (checkpoint every block), see
    :meth:`GPT.set_recompute`.
    """
    predict.validate(precision, optimizer, recompute)
    if recompute != "none" and not isinstance(model, (GPT, GPTConfig, str)):
        raise ValueError(f"recompute={recompute!r} needs the course's GPT (or a config), "
                         f"got {type(model).__name__}")
    if iterations < 2:
        raise ValueError("iterations must be >= 2: optimizer states appear in the first step")
    if isinstance(model, (GPTConfig, str)):
        config = get_config(model)
        shape = batch_shape(batch, config.seq_len)
        if not fake:
            _check_fits(predict.model_state_bytes_for(config, precision, optimizer)["model_states"]
                        + flow_bytes(config, shape, precision))
        with FakeTensorMode() if fake else nullcontext():
            model, batch = _build(config, shape, precision, seed)
            model.set_recompute(recompute)
            opt = _optimizer(model, optimizer, precision, fake)
            report = tracked_steps(model, opt, batch, loss_fn=loss_fn or GPT.loss,
                                   iterations=iterations, autocast_dtype=_autocast(precision))
    elif fake:
        raise ValueError("fake=True needs a GPTConfig or preset name and batch=(batch_size, seq_len), "
                         "not a module: a built module has already allocated its memory")
    else:
        _check_module(model, batch, precision)
        states = predict.model_state_bytes_for(model, precision, optimizer)
        extra = states["grads"] + states["optimizer"]
        if isinstance(model, GPT):
            extra += flow_bytes(model.config, tuple(batch[0].shape), precision)
        _check_fits(extra)
        opt = _optimizer(model, optimizer, precision, False)
        before = getattr(model, "recompute", "none")
        if isinstance(model, GPT):
            model.set_recompute(recompute)
        try:
            report = tracked_steps(model, opt, batch, loss_fn=loss_fn, iterations=iterations,
                                   autocast_dtype=_autocast(precision))
        finally:
            if isinstance(model, GPT):
                model.set_recompute(before)
    report.info.update(precision=precision, optimizer=optimizer, fake=fake, recompute=recompute,
                       batch=tuple(batch[0].shape))
    return report


def measure_inference(model: nn.Module | GPTConfig | str, inputs: torch.Tensor | tuple[int, int],
                      *, precision: str = "fp32", fake: bool = False, seed: int = 0) -> MemoryReport:
    """One forward under ``torch.no_grad()``: weights plus short-lived activations, nothing saved.

    Takes the same kinds of arguments as :func:`measure_step` (``inputs`` alone, or a shape).
    """
    predict.validate(precision)
    if isinstance(model, (GPTConfig, str)):
        config = get_config(model)
        shape = batch_shape(inputs, config.seq_len)
        if not fake:
            _check_fits(predict.inference_bytes(param_count(config), precision)
                        + flow_bytes(config, shape, precision))
        with FakeTensorMode() if fake else nullcontext():
            model, (inputs, _) = _build(config, shape, precision, seed)
            return _forward_only(model, inputs, precision, fake)
    if fake:
        raise ValueError("fake=True needs a GPTConfig or preset name and a (batch_size, seq_len) shape")
    return _forward_only(model, inputs, precision, fake)


def _forward_only(model: nn.Module, inputs: torch.Tensor, precision: str, fake: bool) -> MemoryReport:
    tracker = GlobalMemTracker()
    tracker.track_external(model, inputs)
    device = next(model.parameters()).device
    with tracker, torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16,
                                                  enabled=precision == "amp"):
        start = categorize(tracker.get_tracker_snapshot())
        out = model(inputs)
        after = categorize(tracker.get_tracker_snapshot())
        del out
    peak = categorize(tracker.get_tracker_snapshot("peak"))
    measured = {key: start[key] for key in STATE_KEYS}
    measured["model_states"] = sum(measured.values())
    measured.update(activations=peak["activations"], temporaries=peak["temporaries"],
                    inputs=start["inputs"], peak=sum(peak.values()))
    info = {"mode": "inference", "precision": precision, "fake": fake, "batch": tuple(inputs.shape),
            "device": str(device)}
    n_params = sum(p.numel() for p in model.parameters())
    return MemoryReport(measured, [("start", start), ("forward", after)], peak, n_params, info)


def _build(config: GPTConfig, shape: tuple[int, int], precision: str, seed: int) -> tuple[GPT, Batch]:
    torch.manual_seed(seed)
    model = GPT(config, dtype=_DTYPE[precision])
    fake = isinstance(torch.empty(0), FakeTensor)  # inside FakeTensorMode: no real generator
    gen = None if fake else torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (shape[0], shape[1] + 1), generator=gen)
    return model, (tokens[:, :-1].clone(), tokens[:, 1:].clone())  # clone: own storage even if b=1


def _optimizer(model: nn.Module, name: str, precision: str, fake: bool) -> torch.optim.Optimizer:
    if precision in predict.MIXED:  # bf16 weights, fp32 master copies and moments
        return MixedPrecisionAdam(model.parameters(), decoupled=name == "adamw",
                                  fp32_grads=precision == "mixed-fp32-grads")
    return make_optimizer(model.parameters(), name, foreach=False if fake else None)


def _autocast(precision: str) -> torch.dtype | None:
    return torch.bfloat16 if precision == "amp" else None


def _check_module(model: nn.Module, batch: object, precision: str) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError("model must be an nn.Module, a GPTConfig or a preset name, "
                        f"got {type(model).__name__}")
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2
            and all(isinstance(t, torch.Tensor) for t in batch)):
        raise ValueError("with a module, batch must be a pair of tensors (inputs, targets)")
    want = _DTYPE[precision]
    wrong = {p.dtype for p in model.parameters() if p.is_floating_point() and p.dtype != want}
    if wrong:
        hint = "call model.to(torch.bfloat16) first" if want == torch.bfloat16 else "use an fp32 model"
        raise ValueError(f"precision={precision!r} needs {want} parameters but the model has "
                         f"{sorted(map(str, wrong))}: {hint}")


def _check_fits(needed: int) -> None:
    free = psutil.virtual_memory().available
    if needed > free:
        raise MemoryError(f"this run needs about {format_bytes(needed)} but only {format_bytes(free)} "
                          f"of RAM is free; use fake=True to estimate it without allocating, "
                          f"or a smaller model or batch")
