"""DeepSpeed's bf16 section counted on 2 CPU ranks; the census on a fake engine; exercise 3.

One launch (module fixture) trains every ZeRO stage with ``"bf16": {"enabled": true}`` (the
tiny GPT and an awkward one) and runs configs with 2 micro-batches of gradient accumulation
through :func:`course_lib.deepspeed.ranks.config_census`, in fp32 and bf16. The measured bytes
are compared with :func:`predict_deepspeed` and, independently of it, with the bytes per
parameter of mixed precision (2 + 2 + 12, chapter 1's ``precision="mixed"``).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from course_lib import zero
from course_lib.common.models import GPTConfig, get_config, param_count
from course_lib.deepspeed.holdings import holdings, predict_deepspeed
from course_lib.deepspeed.config import deepspeed_config
from course_lib.deepspeed.exercises import check_ds_config
from course_lib.exercises import check_true
from course_lib.launcher.launch import run
from course_lib.memory.predict import bytes_per_param, model_state_bytes

pytest.importorskip("deepspeed")

WORLD = 2
ODD = GPTConfig(n_layer=1, n_head=3, d_model=9, vocab_size=37, seq_len=9)  # Ψ not a multiple of 4


def _launch() -> dict:
    from course_lib.deepspeed.ranks import config_census, train_rank_deepspeed
    bf16 = {"tiny": train_rank_deepspeed(steps=2, reference=False, torch_memory=False,
                                         make_config=lambda k: deepspeed_config(k, bf16=True)),
            "odd": train_rank_deepspeed((1, 2, 3), ODD, steps=2, batch=(2, 9), reference=False,
                                        torch_memory=False,
                                        make_config=lambda k: deepspeed_config(k, micro_batch=2,
                                                                               bf16=True))}
    accum = {(precision, stage): config_census(deepspeed_config(stage, grad_accum=2,
                                                                bf16=precision == "bf16"))
             for precision in ("fp32", "bf16") for stage in (0, 1, 2, 3)}
    return {"bf16": bf16, "accum": accum}


@pytest.fixture(scope="module")
def launched():
    return run(_launch, WORLD, timeout=300)


def test_bf16_measured_equals_prediction_to_the_byte(launched):
    for name, config in (("tiny", "tiny"), ("odd", ODD)):
        shapes = zero.param_shapes(config)
        for rank, mine in enumerate(r["bf16"][name] for r in launched):
            for stage in [k for k in mine if isinstance(k, int)]:
                assert mine[stage]["dtype"] == "torch.bfloat16"
                for moment, key in (("backward", "after_backward"), ("step", "after_step")):
                    assert mine[stage][key] == predict_deepspeed(
                        shapes, stage, WORLD, rank=rank, moment=moment, precision="bf16"), \
                        (name, rank, stage, moment)


def test_bf16_stage0_is_the_mixed_precision_16_bytes(launched):
    """Independent of predict_deepspeed: 2 + 2 + 4 + 8 bytes per parameter + Adam's counters."""
    config = get_config("tiny")
    psi, tensors = param_count(config), len(zero.param_shapes(config))
    per = bytes_per_param("mixed")
    assert (per["params"], per["grads"], per["optimizer"], per["total"]) == (2, 2, 12, 16)
    chapter1 = model_state_bytes(psi, "mixed", n_tensors=tensors)  # buffers: none in the GPT
    for mine in (r["bf16"]["tiny"] for r in launched):
        got = mine[0]["after_backward"]
        assert (got["params"], got["grads"], got["master"]) == (2 * psi, 2 * psi, 4 * psi)
        assert got["optimizer"] == 8 * psi + 4 * tensors and got["buckets"] == got["other"] == 0
        assert got["model_states"] == 16 * psi + 4 * tensors == chapter1["model_states"]
        assert mine[0]["after_step"]["grads"] == 0  # fp32 grads live only inside step()


def test_bf16_partitions_follow_the_paper_plus_buffers(launched):
    """ZeRO-2 ``2Ψ + (2+12)Ψ/N`` and ZeRO-3 ``16Ψ/N``, exact for the tiny GPT (Ψ % 4 == 0)."""
    config = get_config("tiny")
    psi = param_count(config)
    assert psi % (2 * WORLD) == 0  # no padding: the paper's formulas hold to the byte
    paper = zero.paper_bytes(psi, WORLD, k=12)
    for mine in (r["bf16"]["tiny"] for r in launched):
        for stage in (1, 2):
            after = mine[stage]["after_step"]  # the gradient buffer is gone after the step
            assert after["params"] + after["master"] + after["optimizer"] == \
                2 * psi + 12 * psi // WORLD + 4  # + Adam's one step counter
            assert mine[stage]["after_backward"]["grads"] >= 2 * psi // WORLD  # whole tensors
        stage3 = mine[3]["after_step"]
        assert stage3["model_states"] == paper["fsdp"] + 2 * 2**14 + 4 + 8 + 1  # bucket, scalars


def test_accumulation_moment_predicted_for_fp32_and_bf16(launched):
    shapes = zero.param_shapes("tiny")
    for rank, accum in enumerate(r["accum"] for r in launched):
        for (precision, stage), got in accum.items():
            assert (got["micro"], got["accum"], got["train_batch"]) == (4, 2, 4 * 2 * WORLD)
            for moment in ("accumulate", "backward", "step"):
                assert got[moment] == predict_deepspeed(shapes, stage, WORLD, rank=rank,
                                                        moment=moment, precision=precision), \
                    (rank, precision, stage, moment)
    psi = param_count(get_config("tiny"))
    # what tells ZeRO-1 from ZeRO-2 in DeepSpeed: the full gradient while accumulating
    assert launched[0]["accum"][("bf16", 1)]["accumulate"]["grads"] == 2 * psi
    assert launched[0]["accum"][("bf16", 2)]["accumulate"]["grads"] < 1.1 * 2 * psi / WORLD


def test_predict_rejects_bad_precision_and_moment():
    with pytest.raises(ValueError, match="precision must be 'fp32' or 'bf16'"):
        predict_deepspeed([(4, 4)], 2, 2, precision="fp16")
    with pytest.raises(ValueError, match="moment must be"):
        predict_deepspeed([(4, 4)], 2, 2, moment="forward")


def test_census_counts_a_fake_engine_by_storage_and_attribute():
    """Bytes computed by hand for a bf16 module, fp32 master copies, views into one buffer."""
    module = nn.Linear(3, 4).to(torch.bfloat16)  # 12 + 4 elements, 2 B each
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    master = [p.detach().float().clone() for p in module.parameters()]  # 16 × 4 B
    flat = torch.zeros(10)  # two views into one storage: counted once, 40 B
    adam = SimpleNamespace(state={master[0]: {"exp_avg": torch.zeros(12), "step": torch.zeros(())}})
    zero_opt = SimpleNamespace(optimizer=adam, fp32_groups=[master],
                               all_grad_tensors={0: [flat[:4], flat[4:]]},
                               ipg_buckets=[torch.zeros(8, dtype=torch.bfloat16)],
                               _global_grad_norm=torch.zeros((), dtype=torch.float64))
    got = holdings(SimpleNamespace(module=module, optimizer=zero_opt))
    assert got == {"params": 32, "grads": 32 + 40, "master": 64, "optimizer": 48 + 4,
                   "buckets": 16, "other": 8, "model_states": 32 + 72 + 64 + 52 + 16 + 8}


def _config(world_size: int, *, micro=None, stage=2, bf16=True) -> dict:
    out = {"train_batch_size": 16,
           "train_micro_batch_size_per_gpu": micro or 16 // (2 * world_size),
           "gradient_accumulation_steps": 2,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 2**14},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
    return {**out, "bf16": {"enabled": True}} if bf16 else out


def test_config_exercise_passes_the_solution_and_names_what_is_off():
    passed, message = check_ds_config(_config)
    assert passed, message
    assert "equal the prediction" in message
    wrong = {"train_batch_size is not equal to micro_batch_per_gpu":
             lambda w: _config(w, micro=8),
             "weights are float32": lambda w: _config(w, bf16=False),
             "the full gradient of all": lambda w: _config(w, stage=1),
             "optimizer states are not partitioned": lambda w: _config(w, stage=0),
             "the parameters are partitioned": lambda w: _config(w, stage=3),
             "use world_size": lambda w: _config(2),
             "not a config dict": lambda w: None}
    for expected, fn in wrong.items():
        passed, message = check_ds_config(fn)
        assert not passed and expected in message, (expected, message)
        assert "def " not in message and '"stage": 2' not in message  # no answer in feedback
    bucket = _config(2)
    del bucket["zero_optimization"]["reduce_bucket_size"]
    passed, message = check_ds_config(lambda w: bucket)
    assert not passed and "reduce_bucket_size" in message  # refused before any process starts


def test_config_exercise_stub_and_arguments():
    def stub(world_size):
        raise NotImplementedError

    feedback = check_true(lambda: check_ds_config(stub), name="ds")
    assert not feedback and "NotImplementedError" in feedback.message
    with pytest.raises(TypeError, match="pass your function itself"):
        check_ds_config(_config(2))


def test_precision_table_shows_the_verdict_and_bytes_per_param(launched):
    from course_lib.deepspeed.show import precision_rows, precision_table
    bf16 = {"ranks": [r["bf16"]["tiny"] for r in launched]}
    rows = precision_rows(bf16, bf16)  # the fp32 column is only read, any run will do
    assert [r["stage"] for r in rows] == [0, 1, 2, 3]
    assert all(r["measured"] == r["predicted"] for r in rows)
    lines = precision_table(rows).splitlines()
    assert "2 + 2 + 12 = 16 B/param" in lines[1]
    assert " True " in lines[3] and " 16.00 " in lines[3]  # stage 0: the 16 bytes
    assert precision_table([]) == "no bf16 measurement"
