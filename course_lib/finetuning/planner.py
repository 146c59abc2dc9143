"""The 7B decision: which way of fine-tuning fits on which GPUs, per GPU and per category.

Chapter 7 asks: *given a model, a GPU size and count and a sequence length, do I need to
distribute at all?* :func:`plan_finetuning` lists full fine-tuning (fp32 master weights, bf16 autocast,
Adam) with DDP, ZeRO-1, ZeRO-2 and FSDP on ``n_gpus`` GPUs (chapter 3's fake path,
:func:`course_lib.sharding.measure.measure_distributed`) and LoRA / QLoRA on **one** GPU
(:func:`course_lib.finetuning.footprint.measure_finetune`): bytes per GPU by category, fits or not,
a rough cost (:data:`ASSUMPTIONS`). Every number is a fake-tensor measurement. ``depth="probe"``
(the default above 4 layers) measures two small depths and extrapolates linearly to ``n_layer``
(every block adds the same tensors; ZeRO-1's shares and FSDP's peak are the labelled
exceptions); ``depth="full"`` measures at full depth. Runs are spread over one process per core
(:mod:`course_lib.finetuning.probes`) and cached in the ``cache`` dict a caller passes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from course_lib.common.checks import positive_int
from course_lib.common.deprecation import renamed
from course_lib.common.models import GPTConfig, get_config, param_count
from course_lib.finetuning.probes import (ADAPTER_METHODS, FULL_STRATEGIES, Probe, measure_many,
                                         measure_method)
from course_lib.launcher import devices, progress
from course_lib.sharding.formulas import canonical_strategy, param_shapes, per_rank_bytes

__all__ = ["FULL_STRATEGIES", "ADAPTER_METHODS", "ASSUMPTIONS", "PlanRow", "Plan", "plan_finetuning",
           "measure_method"]

_LABELS = {"ddp": "full FT · DDP", "zero1": "full FT · ZeRO-1", "fsdp_no_reshard": "full FT · FSDP, no reshard",
           "fsdp": "full FT · FSDP", "lora": "LoRA (bf16 base)", "qlora": "QLoRA (NF4 base)"}
_KEYS = ("weights", "grads", "optimizer", "activations", "peak")
#: Depths of the two probe runs per method (FSDP2's peak with one block is not on the line).
_PROBE_LAYERS = {"ddp": (1, 2), "zero1": (1, 2), "fsdp_no_reshard": (2, 3), "fsdp": (2, 3), "lora": (1, 2),
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
    """The table :func:`plan_finetuning` returns; prints as text. ``rows`` in display order."""

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
        cols = f"{'method':<27}{'GPUs':>5}" + "".join(f"{k:>12}" for k in _KEYS)
        lines = [head, cols + f"{'fits':>6}{'GPU-h':>9}{'$':>9}  source"]
        for r in self.rows:
            vals = "".join(f"{r.bytes[k] / div:>12.2f}" for k in _KEYS)
            lines.append(f"{_LABELS[r.method]:<27}{r.gpus:>5}{vals}{'yes' if r.fits else 'NO':>6}"
                         f"{r.gpu_hours:>9.1f}{r.cost_usd:>9.0f}  {r.source}")
        a = self.assumptions
        lines.append(f"cost: {a['tokens'] / 1e6:g}M tokens, {a['tflops']:g} TFLOP/s × {a['mfu']:.0%} "
                     f"MFU, ${a['usd_per_gpu_hour']:g}/GPU-hour (rough)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()


def _key(config: GPTConfig, method: str, n_gpus: int, shape, r: int, recompute: str) -> Probe:
    """The probe (and cache key) of one fake run; recomputation only applies to full fine-tuning."""
    return (config, method, n_gpus, shape, r, recompute if method in FULL_STRATEGIES else "none")


def _depths(config: GPTConfig, method: str, probe: bool) -> tuple[GPTConfig, ...]:
    """The configs a method is measured at: two probe depths, or the config itself."""
    if probe and config.n_layer > _PROBE_LAYERS[method][1]:
        return tuple(config.replace(n_layer=k) for k in _PROBE_LAYERS[method])
    return (config,)


def _extrapolated(cache: dict, config: GPTConfig, method: str, n_gpus: int, shape, r: int,
                  recompute: str) -> tuple[dict, str]:
    low, high = _PROBE_LAYERS[method]
    a = cache[_key(config.replace(n_layer=low), method, n_gpus, shape, r, recompute)]
    b = cache[_key(config.replace(n_layer=high), method, n_gpus, shape, r, recompute)]
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


def plan_finetuning(model: GPTConfig | str = "gpt-7b", *, gpu_memory_gb: float = 80,
                    n_gpus: int = 8, seq_len: int = 2048, micro_batch: int = 1, r: int = 16,
                    tokens: float = 100e6, depth: str = "auto",
                    methods: tuple[str, ...] = FULL_STRATEGIES + ADAPTER_METHODS,
                    cache: dict | None = None, recompute: str = "none",
                    processes: int | None = None, **assumptions: float) -> Plan:
    """Full fine-tuning (4 strategies on ``n_gpus``) vs LoRA / QLoRA (1 GPU): per-GPU bytes, fits, cost.

    ``model``: a :class:`GPTConfig` or preset name (a longer ``seq_len`` than the config's
    extends its position table). ``r``: LoRA rank (adapters on qkv, attn.proj, mlp.fc, mlp.proj).
    ``tokens``: fine-tuning tokens for the cost. ``depth``: ``"full"`` measures at full depth,
    ``"probe"`` at two small depths (extrapolated), ``"auto"`` probes above 4 layers. ``methods``: a
    subset of the rows (each costs fake runs). ``recompute``: ``"none"``, ``"selective"`` or
    ``"full"`` activation recomputation for the full fine-tuning rows (chapter 1; the adapter
    rows are measured without it). ``processes``: how many processes share the fake runs
    (default: one per core, up to 4, for models of 100M+ parameters; 1: all in this process). Keyword
    overrides of :data:`ASSUMPTIONS`: ``tflops``, ``mfu``, ``usd_per_gpu_hour``, ``usable_fraction``.
    """
    config = _check(model, gpu_memory_gb, n_gpus, seq_len, micro_batch, r, tokens, depth)
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    if processes is not None:
        positive_int(processes, "processes")
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
    methods = tuple(canonical_strategy(m) for m in methods)
    bad = [m for m in methods if m not in FULL_STRATEGIES + ADAPTER_METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {FULL_STRATEGIES + ADAPTER_METHODS}, "
                         f"got {methods!r}")
    runs = [_key(c, m, n_gpus if m in FULL_STRATEGIES else 1, shape, r, recompute)
            for m in methods for c in _depths(config, m, probe)]
    todo = [run for run in dict.fromkeys(runs) if run not in cache]
    if processes is None:  # at 100M+ parameters a fake run takes a second or more: one per core
        processes = min(4, devices.cpu_count()) if n >= 1e8 else 1
    # a live line in JupyterLab while the fake runs go on (silent elsewhere)
    size = f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"
    with progress.running(f"planning {size} params: {len(todo)} fake runs on "
                          f"{min(processes, max(1, len(todo)))} process(es)", unit="fake runs"):
        cache.update(measure_many(todo, processes))
    for method in methods:
        gpus = n_gpus if method in FULL_STRATEGIES else 1
        if len(_depths(config, method, probe)) == 2:
            per_gpu, source = _extrapolated(cache, config, method, gpus, shape, r, recompute)
        else:
            per_gpu = cache[_key(config, method, gpus, shape, r, recompute)]
            source = "fake, full depth"
        if recompute != "none" and method in FULL_STRATEGIES:
            source += f"; recompute={recompute}"
        # full recomputation runs each block's forward once more: 8·N instead of 6·N
        full = 8 if recompute == "full" else 6
        flops = (full if method in FULL_STRATEGIES else 4) * n * a["tokens"]
        gpu_hours = flops / (a["tflops"] * 1e12 * a["mfu"]) / 3600
        out.rows.append(PlanRow(method, gpus, per_gpu, per_gpu["peak"] <= usable, gpu_hours,
                                gpu_hours * a["usd_per_gpu_hour"], source))
    return out


# ``plan`` before issue 51 (the launcher's placement was ``plan`` too; it is ``place`` now)
__getattr__ = renamed(__name__, {"plan": "plan_finetuning"})
