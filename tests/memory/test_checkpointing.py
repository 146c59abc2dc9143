"""torch's activation checkpointing API (chapter 01): checkpoint_wrapper keeps what the model's own
full recomputation keeps, a selective policy keeps the listed operators' outputs, gradients unchanged."""
import pytest

from course_lib.common.models import PRESETS
from course_lib.launcher.launch import run
from course_lib.memory import predict
from course_lib.memory.checkpointing import checkpointed_steps

EXPLICIT = PRESETS["tiny"].replace(seq_len=256, attention="explicit")   # chapter 01's section-7 model
BATCH = (4, 64)


@pytest.fixture(scope="module")
def measured():
    return run(checkpointed_steps, 1, EXPLICIT, BATCH, repeats=1, threads=1)[0]


def test_no_wrapper_and_full_wrapper_keep_the_predicted_bytes(measured):
    """The prediction counts the model's own ``set_recompute`` modes, never torch's wrapper."""
    for mode in ("none", "full"):
        assert measured[mode]["activations"] == predict.activation_bytes(EXPLICIT, *BATCH, "fp32", mode), mode


def test_selective_keeps_the_matmul_outputs_and_block_inputs(measured):
    """Per block the matmuls (addmm) output qkv 3h, attention proj h, fc 4h, MLP proj h values per
    token (fp32): 9·b·s·h values per block more than full, which keeps the block input only."""
    b, s = BATCH
    h, layers = EXPLICIT.d_model, EXPLICIT.n_layer
    assert measured["selective"]["activations"] - measured["full"]["activations"] == layers * 9 * b * s * h * 4


def test_gradients_are_those_of_the_plain_model(measured):
    for mode, row in measured.items():
        assert row["grad_diff"] == 0.0, mode
        assert row["forward_s"] > 0 and row["step_s"] >= row["forward_s"]
