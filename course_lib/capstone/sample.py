"""Text from the trained weights: the GPT run forward one byte at a time (no KV cache: the
models are small), each next byte drawn from the softmax of the logits at a temperature, from a
seeded generator, so the same weights and seed give the same text.

How much a sample reads like the corpus, in two numbers: :func:`printable_share` (characters
that are printable ASCII or a newline; the corpus is all of them, an untrained model's bytes
about 37 %) and :func:`word_overlap` (the share of its words, runs of three or more letters,
that occur in the corpus; shorter runs of random bytes are often words by chance). :func:`as_text` shows a sample as text: newlines as newlines, anything
outside printable ASCII as ``·``.
"""
from __future__ import annotations

import functools
import re

import torch

from course_lib.common.data import decode, encode, load_corpus
from course_lib.common.models import GPT, GPTConfig

__all__ = ["model_from", "generate", "printable_share", "word_overlap", "corpus_words", "as_text"]

_WORD = re.compile(r"[a-z]{3,}")


def model_from(config: GPTConfig, params: dict[str, torch.Tensor] | None = None,
               seed: int = 0) -> GPT:
    """The dense GPT with ``params`` (a ``train_gpt`` result's), or freshly initialised."""
    torch.manual_seed(seed)
    model = GPT(config)
    if params is not None:
        model.load_state_dict(params)
    return model.eval()


@torch.no_grad()
def generate(model: GPT, prompt: str = "\n", n_bytes: int = 120, temperature: float = 0.8,
             seed: int = 0) -> str:
    """``prompt`` followed by ``n_bytes`` sampled bytes (the last ``seq_len`` bytes as context)."""
    if not prompt or temperature <= 0:
        raise ValueError("need a non-empty prompt and a positive temperature")
    gen = torch.Generator().manual_seed(seed)
    ids = encode(prompt)
    for _ in range(n_bytes):
        logits = model(ids[-model.config.seq_len:][None])[0, -1].float()
        probs = torch.softmax(logits / temperature, dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)])
    return decode(ids)


def _printable(ch: str) -> bool:
    return ch == "\n" or " " <= ch <= "~"


def printable_share(text: str) -> float:
    """The share of ``text``'s characters that are printable ASCII or a newline."""
    return sum(map(_printable, text)) / len(text) if text else 0.0


@functools.lru_cache(maxsize=1)
def corpus_words() -> frozenset[str]:
    """Every word (lower-case run of three or more letters) of the course corpus."""
    return frozenset(_WORD.findall(load_corpus().lower()))


def word_overlap(text: str, vocabulary: frozenset[str] | None = None) -> float:
    """The share of ``text``'s words (lower-case runs of three or more letters) found in
    ``vocabulary`` (the corpus's words by default); 0 for a text without words."""
    vocabulary = corpus_words() if vocabulary is None else vocabulary
    found = _WORD.findall(text.lower())
    return sum(w in vocabulary for w in found) / len(found) if found else 0.0


def as_text(text: str) -> str:
    """``text`` to print: newlines stay, any other character outside printable ASCII is ``·``."""
    return "".join(ch if _printable(ch) else "·" for ch in text)
