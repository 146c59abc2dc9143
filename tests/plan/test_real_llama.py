"""The planner against a real architecture on real ranks: a small Llama (transformers' own class:
grouped-query attention, SwiGLU, RoPE), each layout's per-rank peak planned on fake tensors
(``measure_layout``: a full build, and the planner's own path, 3 and 4 blocks scaled to 6) within
5 % of the peak each of 4 real CPU ranks measures running the same recipe
(``course_lib.plan.real``); and the check catches a planner that forgets Adam's moments, the
tensor-parallel split, that transformers masks and repeats K/V only on fake tensors, or that
torch's FLOP counter decomposes SwiGLU's ``silu_backward``."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils.flop_counter import _FlopCounterMode

from course_lib.plan import fake_step, measures, recipe
from course_lib.plan.layouts import Candidate
from course_lib.plan.models import load_config, model_spec
from course_lib.plan.planner import clear_cache, measure_layout
from course_lib.plan.real import compare, measure_real

#: hidden 256, 8 heads sharing 2 key/value heads, SwiGLU 688, RoPE; 6 blocks (> 4: scaled)
LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 6,
         "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2048,
         "max_position_embeddings": 1024, "tie_word_embeddings": False}
SEQ, MICRO = 256, 2  # tokens per sequence, sequences per data-parallel rank
LAYOUTS = [
    Candidate(dp_shard=4), Candidate(dp_shard=4, ac="selective"),
    Candidate(dp_shard=4, ac="full"),
    Candidate(dp_shard=2, tp=2), Candidate(dp_shard=2, tp=2, ac="selective"),
    Candidate(dp_shard=2, tp=2, ac="full"),
    Candidate(dp_replicate=2, tp=2),          # data parallel 2 (replicas) x TP 2
    Candidate(dp_replicate=2, dp_shard=2),    # HSDP 2 x 2
]


def _id(c: Candidate) -> str:
    return f"{c.label}-{c.ac}"


@pytest.fixture(scope="module")
def config():
    return load_config(LLAMA)


@pytest.fixture(scope="module")
def real(config) -> dict:
    """Each layout's step on 4 real ranks: one launch per global batch (data-parallel size)."""
    out = {}
    for dp in sorted({c.dp for c in LAYOUTS}):
        out.update(measure_real(config, [c for c in LAYOUTS if c.dp == dp],
                                global_batch=MICRO * dp, seq_len=SEQ))
    return out


def _planned(config, c: Candidate, depth: int | None):
    return measure_layout(config, c, model_spec(config), MICRO * c.dp, SEQ, depth=depth)[0]


def _off(planned, runs) -> float:
    print(compare(planned, runs))
    assert len(runs) == 4 and all(r.peak for r in runs)
    return max(abs(planned.peak / r.peak - 1) for r in runs)


@pytest.mark.parametrize("layout", LAYOUTS, ids=_id)
def test_planned_peak_within_5_percent_of_real_ranks(layout, config, real):
    """A full build (6 blocks) and the planner's scaling from 3 and 4 blocks, against each rank."""
    assert _off(_planned(config, layout, LLAMA["num_hidden_layers"]), real[layout]) <= 0.05
    assert _off(_planned(config, layout, None), real[layout]) <= 0.05


@pytest.mark.xfail(strict=True, reason="the optimizer step's own peak on fake tensors holds AdamW's "
                   "temporaries the real ranks free: +26 % here (+8 % to +96 % across LAYOUTS); "
                   "the backward's peak is the larger in every layout here; not explained yet")
def test_the_optimizer_steps_phase_matches_real_ranks(config, real):
    c = Candidate(dp_shard=4)
    planned = _planned(config, c, LLAMA["num_hidden_layers"]).phases["step"]
    assert all(abs(planned / r.phases["step"] - 1) <= 0.05 for r in real[c])


def _sgd(params, lr, **kwargs):
    return torch.optim.SGD(params, lr=lr)


@pytest.mark.parametrize("what, patches, layout", [
    ("Adam's moments", [(recipe, "_make_states", lambda *a: None), (torch.optim, "AdamW", _sgd)],
     Candidate(dp_shard=4)),
    ("the TP split", [(recipe, "_apply_tp", lambda *a: None)], Candidate(dp_shard=2, tp=2)),
    ("that transformers masks packed rows on fake tensors",
     [(fake_step, "unpacked_rows", contextlib.nullcontext)], Candidate(dp_shard=4)),
    ("that torch's FLOP counter decomposes silu_backward",
     [(measures, "_CountAsRun", _FlopCounterMode)], Candidate(dp_shard=4, ac="full")),
], ids=["moments", "tp-split", "packed-mask", "flop-decomposition"])
def test_the_check_fails_on_a_planner_that_forgets(what, patches, layout, config, real, monkeypatch):
    runs = real[layout]
    clear_cache()
    for target, name, value in patches:
        monkeypatch.setattr(target, name, value)
    try:
        miss = _off(_planned(config, layout, None), runs)
    finally:
        monkeypatch.undo()
        clear_cache()
    print(f"forgetting {what}: {miss:+.1%}")
    assert miss > 0.05, f"a planner forgetting {what} passed"


@pytest.mark.parametrize("layout, match", [
    (Candidate(dp_shard=2, pp=2), "pp > 1 is modelled"),
    (Candidate(dp_shard=2, cp=2), "cp > 1 is modelled"),
    (Candidate(dp_shard=3), "does not split"),
    (Candidate(tp=4, dp_shard=1), "tp 4 must divide"),
])
def test_a_layout_that_cannot_run_is_refused_before_any_process_starts(layout, match, config):
    with pytest.raises(ValueError, match=match):
        measure_real(config, layout, global_batch=4, seq_len=SEQ)
