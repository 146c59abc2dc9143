"""What LoRA and QLoRA give up: the same fine-tuning steps, full vs LoRA vs QLoRA, measured loss.

Chapter 7 (``07_before_you_distribute``). The lab needs two kinds of lines, which the course's
generated text (:func:`course_lib.common.data.make_corpus`, seed 0: the corpus before Tiny
Shakespeare) mixes: sentences about a GPU cluster and sums like ``"12 + 30 = 42."``. We **pretrain** a
tiny GPT on the sentences only, then **fine-tune** it on the sums — a new "task" the base has not
seen — with the same number of steps, batch and data order for every method, and compare the
held-out loss on sums (and how much the sentence loss got worse: forgetting).

Learning rates differ on purpose and are stated: LoRA updates few parameters and is usually run
with a larger learning rate than full fine-tuning; each value here was picked once, not tuned per
run. Seconds on 2 CPU cores.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from course_lib.common.data import encode, make_corpus
from course_lib.common.models import GPT, GPTConfig, get_config
from course_lib.finetuning.lora import add_lora, trainable_parameters
from course_lib.finetuning.quantize import quantize_model

__all__ = ["task_tokens", "pretrain", "finetune", "compare_finetuning", "FinetuneResult"]

_LR = {"full": 1e-3, "lora": 5e-3, "qlora": 5e-3}


def task_tokens(kind: str) -> dict[str, torch.Tensor]:
    """The generated lines of one kind (``"sentences"`` or ``"sums"``) as token ids, split 90/10."""
    if kind not in ("sentences", "sums"):
        raise ValueError(f"kind must be 'sentences' or 'sums', got {kind!r}")
    lines = make_corpus(seed=0).splitlines()  # not data/corpus.txt (Tiny Shakespeare): no sums there
    keep = [ln for ln in lines if (" + " in ln) == (kind == "sums")]
    data = encode("\n".join(keep) + "\n")
    cut = int(len(data) * 0.9)
    return {"train": data[:cut], "val": data[cut:]}


def _batch(data: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    windows = torch.stack([data[i:i + seq + 1] for i in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def _eval(model: GPT, data: torch.Tensor, seq: int, batches: int = 8) -> float:
    gen = torch.Generator().manual_seed(1234)  # the same held-out windows for every model
    losses = [GPT.loss(model(x), y).item() for x, y in (_batch(data, 16, seq, gen) for _ in range(batches))]
    return sum(losses) / len(losses)


def _train(model: GPT, data: torch.Tensor, steps: int, lr: float, seq: int, seed: int) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = _batch(data, 16, seq, gen)
        loss = GPT.loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def pretrain(config: GPTConfig | str = "tiny", steps: int = 200, seed: int = 0) -> GPT:
    """A tiny GPT trained on the sentences only (lr 3e-3, batch 16, seed ``seed``)."""
    config = get_config(config)
    torch.manual_seed(seed)
    model = GPT(config)
    _train(model, task_tokens("sentences")["train"], steps, 3e-3, config.seq_len, seed)
    return model


def finetune(base: GPT, method: str, steps: int = 100, r: int = 8, seed: int = 1) -> GPT:
    """A fine-tuned copy of ``base`` on the sums: ``"full"``, ``"lora"`` or ``"qlora"`` (NF4)."""
    if method not in _LR:
        raise ValueError(f"method must be one of {tuple(_LR)}, got {method!r}")
    model = copy.deepcopy(base)
    if method == "qlora":
        quantize_model(model, "nf4")
    if method != "full":
        torch.manual_seed(seed)
        add_lora(model, r=r, alpha=2 * r)
    _train(model, task_tokens("sums")["train"], steps, _LR[method], base.config.seq_len, seed)
    return model


@dataclass
class FinetuneResult:
    """Held-out losses (nats/token) on the new task (sums) and the old one (sentences)."""

    method: str
    trainable: int
    sums_loss: float
    sentences_loss: float
    lr: float


def compare_finetuning(config: GPTConfig | str = "tiny", pretrain_steps: int = 200,
                       finetune_steps: int = 100, r: int = 8, *, threads: int | None = 1
                       ) -> list[FinetuneResult]:
    """Pretrain once, then fine-tune with each method; the base itself is the first row.

    Runs with ``threads`` torch threads (then restores the setting): the tiny model's matmuls
    are too small to gain from a second thread, and on a busy 2-core machine a second thread
    mostly waits (measured: 5.6 s with 1 thread vs 15.9 s with 2). ``None`` keeps torch's.
    """
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        base = pretrain(config, pretrain_steps)
        sums, sentences = task_tokens("sums")["val"], task_tokens("sentences")["val"]
        seq = base.config.seq_len
        rows = [FinetuneResult("base (no FT)", 0, _eval(base, sums, seq),
                               _eval(base, sentences, seq), 0.0)]
        for method in ("full", "lora", "qlora"):
            model = finetune(base, method, finetune_steps, r)
            rows.append(FinetuneResult(method, trainable_parameters(model), _eval(model, sums, seq),
                                       _eval(model, sentences, seq), _LR[method]))
        return rows
    finally:
        torch.set_num_threads(before)
