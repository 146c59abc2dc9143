"""The 7B decision: which way of fine-tuning fits on which GPUs, per GPU and per category.

Chapter 7 (``07_before_you_distribute``) closes the course with one question: *given a model, a
GPU size, a GPU count and a sequence length, do I need to distribute at all?* :func:`plan` lists

* full fine-tuning (fp32 master weights, bf16 autocast, Adam: 16 B/param of model states) with
  DDP, ZeRO-1, ZeRO-2 and FSDP on ``n_gpus`` GPUs — chapter 3's fake distributed path
  (:func:`course_lib.sharding.measure.measure_distributed` with ``fake=True``, rank 0);
* LoRA (frozen bf16 base) and QLoRA (NF4 base) on **one** GPU — chapter 7's fake path
  (:func:`course_lib.finetuning.memory.measure_finetune`);

with bytes per GPU by category, fits or not, and a rough cost. Every number is a fake-tensor
measurement (no memory is allocated). **Depth probes** (``depth="probe"``, the default above 4
layers): each method is measured at two small depths (1 and 2 layers; 2 and 3 for ZeRO-2 and
FSDP, whose single-block peak differs) and extrapolated linearly to ``n_layer`` — exact, because
every block adds the same tensors (the tests compare with full-depth runs). Two exceptions are
labelled: ZeRO-1's greedy whole-tensor shares come from
:func:`course_lib.sharding.formulas.per_rank_bytes`, and FSDP's *peak*, not linear in depth, is
an upper estimate (``benchmarks/bench_ch7_planner.py`` compares). ``depth="full"`` measures at
full depth. Results are cached in the ``cache`` dict a caller passes; the garbage collector is
paused during the fake runs (they create many short-lived objects).

Cost (rough, stated): training FLOPs per token 6·N for full fine-tuning, 4·N for (Q)LoRA (no
weight gradients for frozen weights: forward 2N + input-gradients 2N), at ``mfu`` × ``tflops``.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from course_lib.common.checks import positive_int
from course_lib.common.models import GPTConfig, get_config, param_count
from course_lib.finetuning.memory import measure_finetune
from course_lib.launcher import progress
from course_lib.sharding.formulas import param_shapes, per_rank_bytes
from course_lib.sharding.measure import measure_distributed

__all__ = ["FULL_STRATEGIES", "ADAPTER_METHODS", "ASSUMPTIONS", "PlanRow", "Plan", "plan",
           "measure_method"]

FULL_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
ADAPTER_METHODS = ("lora", "qlora")
_LABELS = {"ddp": "full FT · DDP", "zero1": "full FT · ZeRO-1", "zero2": "full FT · ZeRO-2",
           "fsdp": "full FT · FSDP", "lora": "LoRA (bf16 base)", "qlora": "QLoRA (NF4 base)"}
_KEYS = ("weights", "grads", "optimizer", "activations", "peak")
#: Depths of the two probe runs per method (FSDP2's peak with one block is not on the line).
_PROBE_LAYERS = {"ddp": (1, 2), "zero1": (1, 2), "zero2": (2, 3), "fsdp": (2, 3), "lora": (1, 2),
                 "qlora": (1, 2)}
#: Default cost assumptions: an 80 GB A100-class GPU (312 dense bf16 TFLOP/s), 40 % MFU, $2/GPU-h.
ASSUMPTIONS = {"tflops": 312.0, "mfu": 0.40, "usd_per_gpu_hour": 2.0, "usable_fraction": 0.90}


@dataclass
class PlanRow:
    """One way to train: per-GPU bytes by category, verdict, rough cost, and where numbers came from."""

    method: str
    gpus: int
    bytes: dict[str, int]
    fits: bool
    gpu_hours: float
    cost_usd: float
    source: str


@dataclass
class Plan:
    """The table :func:`plan` returns; prints as text. ``rows`` in display order."""

    config: GPTConfig
    n_params: int
    gpu_memory_gb: float
    n_gpus: int
    seq_len: int
    micro_batch: int
    rows: list[PlanRow] = field(default_factory=list)
    assumptions: dict[str, float] = field(default_factory=dict)

    def row(self, method: str) -> PlanRow:
        for r in self.rows:
            if r.method == method:
                return r
        raise KeyError(f"no row {method!r}; rows are {[r.method for r in self.rows]}")

    def table(self) -> str:
        usable = self.assumptions["usable_fraction"] * self.gpu_memory_gb
        biggest = max([r.bytes["peak"] for r in self.rows] + [1])
        unit, div = next((u, d) for u, d in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if biggest >= d or u == "kB")
        head = (f"{self.n_params / 1e6:,.1f}M params, seq {self.seq_len} × micro-batch "
                f"{self.micro_batch}; GPUs: {self.n_gpus} × {self.gpu_memory_gb:g} GB "
                f"(fits = peak ≤ {usable:.3g} GB usable); per GPU, in {unit} (1 GB = 1e9 bytes)")
        cols = f"{'method':<18}{'GPUs':>5}" + "".join(f"{k:>12}" for k in _KEYS)
        lines = [head, cols + f"{'fits':>6}{'GPU-h':>9}{'$':>9}  source"]
        for r in self.rows:
            vals = "".join(f"{r.bytes[k] / div:>12.2f}" for k in _KEYS)
            lines.append(f"{_LABELS[r.method]:<18}{r.gpus:>5}{vals}{'yes' if r.fits else 'NO':>6}"
                         f"{r.gpu_hours:>9.1f}{r.cost_usd:>9.0f}  {r.source}")
        a = self.assumptions
        lines.append(f"cost: {a['tokens'] / 1e6:g}M tokens, {a['tflops']:g} TFLOP/s × {a['mfu']:.0%} "
                     f"MFU, ${a['usd_per_gpu_hour']:g}/GPU-hour (rough)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()


def _summary(rep) -> dict[str, int]:
    b = rep.bytes
    return {"weights": b["params"] + b["buffers"], "grads": b["grads"], "optimizer": b["optimizer"],
            "activations": b["activations"], "peak": b["peak"]}


def measure_method(config: GPTConfig, method: str, n_gpus: int, shape: tuple[int, int],
                   r: int = 16, recompute: str = "none") -> dict[str, int]:
    """Per-GPU bytes (``weights``, ``grads``, ``optimizer``, ``activations``, ``peak``) of one method,
    measured on fake tensors at the config's full depth (rank 0 for the distributed ones).
    ``recompute`` (full fine-tuning only): chapter 1's activation recomputation of the blocks."""
    if method in FULL_STRATEGIES:
        rep = measure_distributed(config, shape, strategy=method, nprocs=n_gpus, precision="amp",
                                  fake=True, ranks=[0], recompute=recompute)[0]
    else:
        rep = measure_finetune(config, shape, method, r=r, fake=True)
    return _summary(rep)


def _cached(cache: dict, config: GPTConfig, method: str, n_gpus: int, shape, r: int,
            recompute: str = "none") -> dict[str, int]:
    recompute = recompute if method in FULL_STRATEGIES else "none"
    key = (config, method, n_gpus, shape, r) + ((recompute,) if recompute != "none" else ())
    if key not in cache:
        cache[key] = measure_method(config, method, n_gpus, shape, r, recompute)
    return cache[key]


def _probed(cache: dict, config: GPTConfig, method: str, n_gpus: int, shape, r: int,
            recompute: str = "none") -> tuple[dict, str]:
    low, high = _PROBE_LAYERS[method]
    a = _cached(cache, config.replace(n_layer=low), method, n_gpus, shape, r, recompute)
    b = _cached(cache, config.replace(n_layer=high), method, n_gpus, shape, r, recompute)
    out = {k: a[k] + (b[k] - a[k]) * (config.n_layer - low) for k in _KEYS}
    source = f"fake, {low}+{high} layers → {config.n_layer}"
    if method == "zero1":  # greedy whole-tensor shares: take rank 0's optimizer share from the formula
        exact = per_rank_bytes(param_shapes(config), "zero1", n_gpus)[0]["optimizer"]
        out["peak"] += exact - out["optimizer"]
        out["optimizer"] = exact
        source += "; optimizer share: formula"
    if method == "fsdp":  # the peak moment moves with depth (blocks gathered/freed one by one)
        source += "; peak: upper estimate"
    return out, source


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause automatic garbage collection (restored on exit, also after an error)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _check(model, gpu_memory_gb, n_gpus, seq_len, micro_batch, r, tokens, depth) -> GPTConfig:
    config = get_config(model)
    for name, value in (("n_gpus", n_gpus), ("seq_len", seq_len), ("micro_batch", micro_batch),
                        ("r", r)):
        positive_int(value, f"{name}")
    if isinstance(gpu_memory_gb, bool) or not isinstance(gpu_memory_gb, (int, float)) or gpu_memory_gb <= 0:
        raise ValueError(f"gpu_memory_gb must be a positive number, got {gpu_memory_gb!r}")
    if not isinstance(tokens, (int, float)) or tokens <= 0:
        raise ValueError(f"tokens must be a positive number, got {tokens!r}")
    if depth not in ("auto", "probe", "full"):
        raise ValueError(f"depth must be 'auto', 'probe' or 'full', got {depth!r}")
    return config if seq_len <= config.seq_len else config.replace(seq_len=seq_len)


def plan(model: GPTConfig | str = "gpt-7b", *, gpu_memory_gb: float = 80, n_gpus: int = 8,
         seq_len: int = 2048, micro_batch: int = 1, r: int = 16, tokens: float = 100e6,
         depth: str = "auto", methods: tuple[str, ...] = FULL_STRATEGIES + ADAPTER_METHODS,
         cache: dict | None = None, recompute: str = "none", **assumptions: float) -> Plan:
    """Full fine-tuning (4 strategies on ``n_gpus``) vs LoRA / QLoRA (1 GPU): per-GPU bytes, fits, cost.

    ``model``: a :class:`GPTConfig` or preset name (a longer ``seq_len`` than the config's
    extends its position table). ``r``: LoRA rank (adapters on qkv, attn.proj, mlp.fc, mlp.proj).
    ``tokens``: fine-tuning tokens for the cost. ``depth``: ``"full"`` measures at full depth,
    ``"probe"`` at two small depths (extrapolated), ``"auto"`` probes above 4 layers. ``methods``: a
    subset of the rows (each costs fake runs). ``recompute``: ``"none"``, ``"selective"`` or
    ``"full"`` activation recomputation for the full fine-tuning rows (chapter 1; the adapter
    rows are measured without it). Keyword
    overrides of :data:`ASSUMPTIONS`: ``tflops``, ``mfu``, ``usd_per_gpu_hour``, ``usable_fraction``.
    """
    config = _check(model, gpu_memory_gb, n_gpus, seq_len, micro_batch, r, tokens, depth)
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    unknown = set(assumptions) - set(ASSUMPTIONS)
    if unknown:
        raise ValueError(f"unknown assumptions {sorted(unknown)}; choose from {sorted(ASSUMPTIONS)}")
    a = {**ASSUMPTIONS, **assumptions, "tokens": float(tokens)}
    cache = {} if cache is None else cache
    shape = (micro_batch, seq_len)
    probe = depth == "probe" or (depth == "auto" and config.n_layer > 4)
    n = param_count(config)
    out = Plan(config, n, gpu_memory_gb, n_gpus, seq_len, micro_batch, assumptions=a)
    usable = a["usable_fraction"] * gpu_memory_gb * 1e9
    bad = [m for m in methods if m not in FULL_STRATEGIES + ADAPTER_METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {FULL_STRATEGIES + ADAPTER_METHODS}, "
                         f"got {methods!r}")
    # a live line in JupyterLab while the fake runs go on (silent elsewhere)
    with progress.running(f"planning {n / 1e9:.2f}B params on fake tensors" if n >= 1e8 else
                          f"planning {n / 1e6:.2f}M params on fake tensors",
                          total=len(methods), unit="methods") as live:
        for method in methods:
            gpus = n_gpus if method in FULL_STRATEGIES else 1
            with _gc_paused():
                if probe and config.n_layer > _PROBE_LAYERS[method][1]:
                    per_gpu, source = _probed(cache, config, method, gpus, shape, r, recompute)
                else:
                    per_gpu = _cached(cache, config, method, gpus, shape, r, recompute)
                    source = "fake, full depth"
                if recompute != "none" and method in FULL_STRATEGIES:
                    source += f"; recompute={recompute}"
            # full recomputation runs each block's forward once more: 8·N instead of 6·N
            full = 8 if recompute == "full" else 6
            flops = (full if method in FULL_STRATEGIES else 4) * n * a["tokens"]
            gpu_hours = flops / (a["tflops"] * 1e12 * a["mfu"]) / 3600
            out.rows.append(PlanRow(method, gpus, per_gpu, per_gpu["peak"] <= usable, gpu_hours,
                                    gpu_hours * a["usd_per_gpu_hour"], source))
            live.advance()
    return out
