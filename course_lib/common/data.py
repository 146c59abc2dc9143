"""The course dataset: Shakespeare's plays as byte-level tokens, per-rank batches.

``data/corpus.txt`` (1.1 MB) is Tiny Shakespeare, the public-domain text character-level GPT
tutorials train on (source and checksum: ``data/README.md``); tokens are raw bytes (vocabulary
256), read once per process (:func:`corpus_tokens`). :func:`get_batch` draws a *global* batch of
``batch_size * world_size`` windows, deterministic in ``(seed, step)``, and hands rank ``r`` rows
``r*batch_size:(r+1)*batch_size``: the ranks' shards are distinct and concatenate to what one
process sees with the global batch, the property data parallelism is checked against.
:func:`make_corpus` keeps the earlier generated text (sentences and sums) for chapter 07's
fine-tuning lab, which needs two kinds of lines. Introduced in chapter 1.
"""
from __future__ import annotations

import functools
import random
import warnings
from pathlib import Path

import torch

from course_lib.common.checks import positive_int

__all__ = ["VOCAB_SIZE", "CORPUS_PATH", "CORPUS_SHA256", "make_corpus", "write_corpus",
           "load_corpus", "corpus_tokens", "encode", "decode", "get_batch"]

VOCAB_SIZE = 256
CORPUS_PATH = Path(__file__).resolve().parents[2] / "data" / "corpus.txt"
#: sha256 of the committed ``data/corpus.txt`` (Tiny Shakespeare, karpathy/char-rnn)
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
_SPLITS = ("train", "val")
_VAL_FRACTION = 0.1

_SUBJECTS = ["rank 0", "rank 1", "rank 2", "rank 3", "the optimizer", "the scheduler", "node 7",
             "the data loader", "the all-reduce", "each worker", "the pipeline stage", "the checkpoint"]
_VERBS = ["sends", "receives", "shards", "averages", "saves", "loads", "gathers", "reduces",
          "recomputes", "frees", "copies", "waits for"]
_OBJECTS = ["the gradients", "the weights", "the activations", "the optimizer states", "a bucket",
            "the loss", "the first layer", "the last micro-batch", "its shard", "the logits"]
_PLACES = ["over the ring", "before the step", "after backward", "in bf16", "to host memory",
           "on every step", "across four nodes", "in the first iteration", "without a copy"]


def make_corpus(seed: int = 0, n_bytes: int = 200_000) -> str:
    """The generated corpus (template sentences about a GPU cluster and sums like
    ``"12 + 30 = 42."``), deterministic in ``seed``; the course trained on it before Tiny
    Shakespeare, and the fine-tuning lab (chapter 07) uses its two kinds of lines."""
    rng = random.Random(seed)
    lines: list[str] = []
    size = 0
    while size < n_bytes:
        if rng.random() < 0.25:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            line = f"{a} + {b} = {a + b}."
        else:
            line = (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
                    f"{rng.choice(_PLACES)}.").capitalize()
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def write_corpus(path: Path | str = CORPUS_PATH, seed: int = 0) -> Path:
    """Deprecated: write :func:`make_corpus` to ``path`` (any path but ``data/corpus.txt``, which
    now holds Tiny Shakespeare and is never overwritten)."""
    warnings.warn("write_corpus is deprecated: data/corpus.txt is Tiny Shakespeare now; "
                  "use make_corpus() for the generated text", DeprecationWarning, stacklevel=2)
    path = Path(path)
    if path.resolve() == CORPUS_PATH:
        raise ValueError(f"{path} is the course corpus (Tiny Shakespeare); write the generated "
                         f"text somewhere else")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(make_corpus(seed), encoding="ascii")
    return path


def load_corpus(path: Path | str = CORPUS_PATH) -> str:
    """The committed corpus as text (a clear error if the file is missing, e.g. a wheel install
    without the repository's ``data/`` folder)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"the course corpus {path} is missing: it ships in the "
                                f"repository's data/ folder (see data/README.md)")
    return path.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=4)
def _tokens(path: str, mtime_ns: int) -> torch.Tensor:
    return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)


def corpus_tokens(path: Path | str = CORPUS_PATH) -> torch.Tensor:
    """The corpus's bytes as a uint8 tensor (1 byte per token, read once per process and
    file version; do not modify it in place)."""
    path = Path(path)
    if not path.exists():
        load_corpus(path)  # the clear error
    return _tokens(str(path.resolve()), path.stat().st_mtime_ns)


def encode(text: str) -> torch.Tensor:
    """Bytes of ``text`` (UTF-8) as an int64 tensor of token ids in ``[0, 256)``."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(ids: torch.Tensor) -> str:
    """Inverse of :func:`encode` (invalid UTF-8 sequences are replaced, not raised)."""
    return bytes(ids.tolist()).decode("utf-8", errors="replace")


def get_batch(batch_size: int, seq_len: int, *, seed: int, step: int = 0, rank: int = 0,
              world_size: int = 1, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s share ``(inputs, targets)`` of the global batch number ``step``.

    Both are int64 of shape ``(batch_size, seq_len)``; ``targets`` is ``inputs`` shifted by one
    token. The first 90 % of the corpus is ``"train"``, the rest ``"val"``.
    """
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("world_size", world_size)):
        positive_int(value, f"{name}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
    data = corpus_tokens()
    cut = int(len(data) * (1 - _VAL_FRACTION))
    data = data[:cut] if split == "train" else data[cut:]
    if seq_len + 1 > len(data):
        raise ValueError(f"seq_len={seq_len} is longer than the {split} split ({len(data)} tokens)")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - seq_len, (batch_size * world_size,), generator=gen)
    mine = starts[rank * batch_size:(rank + 1) * batch_size]
    windows = torch.stack([data[i:i + seq_len + 1] for i in mine.tolist()]).long()
    return windows[:, :-1].clone(), windows[:, 1:].clone()
