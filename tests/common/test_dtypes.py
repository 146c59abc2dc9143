"""One dtype-bytes table for every predictor: its entries are torch's own, and the predictors
that now read it give the same numbers as before (``predictor_numbers.json``, written from the
code before the table existed: ``python -m tests.common.test_dtypes --write`` rewrites it)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from course_lib.common.dtypes import BF16, BOOL, BYTES, FP32, FP64, INT64, nbytes

GOLDEN = Path(__file__).with_name("predictor_numbers.json")
SHAPES = [(256, 64), (64, 64), (192, 64), (64,), (7,), (3, 5, 2)]


def predictor_numbers() -> dict:
    from course_lib.deepspeed.holdings import predict_deepspeed
    from course_lib.finetuning.lora import lora_param_count, lora_state_bytes
    from course_lib.memory import predict
    from course_lib.sharding import formulas as f
    out = {}
    for p in predict.ALL_PRECISIONS:
        for rc in ("none", "selective", "full"):
            out[f"predict_step/{p}/{rc}"] = predict.predict_step("tiny", 3, 16, p, "adam", rc)
        out[f"model_state_bytes_for/{p}"] = predict.model_state_bytes_for("small", p)
        out[f"activation_terms/{p}"] = predict.activation_terms("tiny", 2, 8, p)
    for opt in ("sgd", "adam"):
        out[f"bytes_per_param/{opt}"] = predict.bytes_per_param("fp32", opt)
    out["inference_bytes"] = predict.inference_bytes(1000, "bf16")
    out["batch_bytes"] = predict.batch_bytes(3, 16)
    out["korthikanti"] = predict.korthikanti_bytes("tiny", 2, 8)
    for world in (1, 2, 3, 4):
        out[f"ideal/{world}"] = f.ideal_bytes(1000, world)
        out[f"paper/{world}"] = f.paper_bytes(1000, world)
        for stage in (1, 2):
            out[f"flat_zero/{stage}/{world}"] = f.flat_zero_bytes(1001, stage, world, 3)
        out[f"fsdp_peak_saving/{world}"] = f.fsdp_peak_saving(1000, [100, 300, 200], world)
        for strategy in f.STAGES:
            for prec in ("fp32", "amp"):
                out[f"per_rank/{strategy}/{prec}/{world}"] = f.per_rank_bytes(
                    SHAPES, strategy, world, precision=prec)
                out[f"comm/{strategy}/{prec}/{world}"] = f.comm_bytes(SHAPES, strategy, world, prec)
        for stage in (0, 1, 2, 3):
            for moment in ("step", "backward", "accumulate"):
                for prec in ("fp32", "bf16"):
                    out[f"deepspeed/{stage}/{moment}/{prec}/{world}"] = predict_deepspeed(
                        SHAPES, stage, world, rank=world - 1, moment=moment, precision=prec)
    out["lora_param_count"] = lora_param_count("tiny", 4)
    out["lora_state_bytes"] = lora_state_bytes(1234, 56, 7)
    return json.loads(json.dumps(out))  # tuples as lists, keys as strings: as the file holds them


def test_the_table_is_torchs_itemsize():
    assert all(BYTES[d] == torch.empty(0, dtype=d).element_size() for d in BYTES)
    assert (FP32, BF16, INT64, FP64, BOOL) == (4, 2, 8, 8, 1)
    assert nbytes(torch.complex64) == 8  # not in the table: torch's answer


def test_the_predictors_numbers_are_unchanged():
    want = json.loads(GOLDEN.read_text())
    got = predictor_numbers()
    assert got.keys() == want.keys()
    assert [k for k in want if got[k] != want[k]] == []


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps(predictor_numbers(), indent=0, sort_keys=True) + "\n")
