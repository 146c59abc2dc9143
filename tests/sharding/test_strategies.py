"""Every strategy of course_lib.sharding.strategies trains the same model to the same result as DDP.

Tolerances, per precision:

* fp32 — every strategy computes the same fp32 gradients; only the order in which the ranks'
  contributions are summed differs (all-reduce vs reduce-scatter, 4 ranks). That is a few ulps
  of a gradient; Adam divides by sqrt(v), so after 3 steps of lr 1e-3 a parameter moves by
  ~3e-3 at most and inherits a relative error of ~1e-6: torch's fp32 defaults (rtol 1.3e-6,
  atol 1e-5) hold with margin. DDP itself equals one process on the global batch (same bound).
  One exception, and the reason the fp32 test uses ``bias=False``: the *key* bias of attention
  gets an exactly-zero gradient in exact arithmetic (softmax ignores a shift shared by all keys),
  so its computed gradient is pure rounding noise, and Adam's ``m / sqrt(v)`` turns noise of
  either sign into a full ±lr step: two correct runs then differ by up to 2·lr per step.
* amp — ZeRO-1 and DDP both run under autocast, ZeRO-2 and FSDP under the same
  MixedPrecisionPolicy: each pair must agree like fp32. Across the pairs the arithmetic differs
  (autocast keeps LayerNorm in fp32, the bf16 policy runs everything in bf16): with SGD (lr 0.1,
  3 steps) the parameters differ by lr · Σ|Δgrad| ≲ 3 · 0.1 · 2⁻⁸ · |grad| — below 1e-3 for
  gradients of order 1, while a missing gradient average (half or double the update) or stale
  gradients move parameters by ~lr · |grad| ≈ 1e-2.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_lib import run
from course_lib.common.data import get_batch
from course_lib.common.models import GPT, GPTConfig
from course_lib.sharding.strategies import (STRATEGIES, full_params, train_rank_sharded,
                                            train_step, validate_strategy, wrap)

# Odd sizes: at 4 ranks FSDP pads d_model = 10 and vocab = 37 rows, ZeRO-1's shares are unequal.
ODD = GPTConfig(n_layer=1, n_head=1, d_model=10, vocab_size=37, seq_len=9)
NO_BIAS = ODD.replace(bias=False)
STEPS, BATCH = 3, (4, 9)


def _train_all(config: GPTConfig, precision: str, optimizer: str, lr: float) -> dict:
    """In each rank: every strategy, plus the fake-tensor stand-in for DDP (AllReduceHooks)."""
    out = {s: train_rank_sharded(config, s, steps=STEPS, batch=BATCH, precision=precision,
                                 optimizer=optimizer, lr=lr) for s in STRATEGIES}
    torch.manual_seed(0)
    hooks = wrap(GPT(config), "ddp", optimizer=optimizer, precision=precision, lr=lr,
                 ddp_hooks=True)
    for step in range(STEPS):
        x, y = get_batch(*BATCH, seed=0, step=step, rank=dist.get_rank(),
                         world_size=dist.get_world_size())
        train_step(hooks, (x % config.vocab_size, y % config.vocab_size))
    out["ddp_hooks"] = {"params": full_params(hooks)}
    return out


def _single_process(config: GPTConfig, world: int, lr: float) -> dict[str, torch.Tensor]:
    """One process, the global batch (all ranks' shards concatenated), plain Adam."""
    torch.manual_seed(0)
    model = GPT(config)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(STEPS):
        x, y = get_batch(BATCH[0] * world, BATCH[1], seed=0, step=step)
        opt.zero_grad()
        GPT.loss(model(x % config.vocab_size), y % config.vocab_size).backward()
        opt.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_every_strategy_equals_ddp_fp32_at_4_ranks(no_leftover_ranks):
    ranks = run(_train_all, 4, NO_BIAS, "fp32", "adam", 1e-3)
    ddp = ranks[0]["ddp"]["params"]
    torch.testing.assert_close(ddp, _single_process(NO_BIAS, 4, 1e-3), rtol=1.3e-6, atol=1e-5)
    for strategy in (*STRATEGIES, "ddp_hooks"):
        for rank in ranks:
            torch.testing.assert_close(rank[strategy]["params"], ddp, rtol=1.3e-6, atol=1e-5,
                                       msg=lambda m, s=strategy: f"{s}: {m}")
    for strategy in STRATEGIES:
        assert ranks[0][strategy]["losses"] == pytest.approx(ranks[0]["ddp"]["losses"], rel=1e-5)


def test_amp_strategies_agree_pairwise_and_with_ddp(no_leftover_ranks):
    ranks = run(_train_all, 2, ODD, "amp", "sgd", 0.1)
    got = ranks[0]
    for a, b in (("zero1", "ddp"), ("ddp_hooks", "ddp"), ("fsdp_no_reshard", "fsdp")):
        torch.testing.assert_close(got[a]["params"], got[b]["params"], rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(got["fsdp"]["params"], got["ddp"]["params"], rtol=0, atol=1e-3)
    assert got["fsdp"]["losses"] == pytest.approx(got["ddp"]["losses"], abs=2e-3)
    torch.testing.assert_close(ranks[1]["fsdp"]["params"], got["fsdp"]["params"], rtol=0, atol=0)


def test_the_amp_tolerance_catches_a_missing_gradient_average(no_leftover_ranks):
    """The 1e-3 bound above is tight enough: doubling the learning rate (what summing instead
    of averaging the gradients of 2 ranks does) breaks it."""
    ranks = run(train_rank_sharded, 2, ODD, "fsdp", steps=STEPS, batch=BATCH, precision="amp",
                optimizer="sgd", lr=0.2)
    reference = run(train_rank_sharded, 2, ODD, "ddp", steps=STEPS, batch=BATCH, precision="amp",
                    optimizer="sgd", lr=0.1)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(ranks[0]["params"], reference[0]["params"], rtol=0, atol=1e-3)


def test_tied_embeddings_are_refused_for_fsdp_with_a_clear_message():
    model = GPT(ODD.replace(tie_weights=True, vocab_size=10))
    with pytest.raises(ValueError, match="tied .*untied model"):
        wrap(model, "fsdp")
    assert GPTConfig(n_layer=1, n_head=1, d_model=8).tie_weights is False  # the course default


@pytest.mark.parametrize("kwargs, message", [
    ({"strategy": "zero4"}, "unknown strategy 'zero4'"),
    ({"strategy": "fsdp", "precision": "fp16"}, "precision 'fp16' is not supported"),
    ({"strategy": "ddp", "optimizer": "lion"}, "unknown optimizer 'lion'"),
])
def test_bad_choices_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        validate_strategy(**kwargs)
