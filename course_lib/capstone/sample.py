"""Text from the trained weights: the GPT run forward one byte at a time (no KV cache: the
models are small), each next byte drawn from the softmax of the logits at a temperature, from a
seeded generator, so the same weights and seed give the same text."""
from __future__ import annotations

import torch

from course_lib.common.data import decode, encode
from course_lib.common.models import GPT, GPTConfig

__all__ = ["model_from", "generate"]


def model_from(config: GPTConfig, params: dict[str, torch.Tensor] | None = None,
               seed: int = 0) -> GPT:
    """The dense GPT with ``params`` (a ``train_gpt`` result's), or freshly initialised."""
    torch.manual_seed(seed)
    model = GPT(config)
    if params is not None:
        model.load_state_dict(params)
    return model.eval()


@torch.no_grad()
def generate(model: GPT, prompt: str = "Rank 0 ", n_bytes: int = 120, temperature: float = 0.8,
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
