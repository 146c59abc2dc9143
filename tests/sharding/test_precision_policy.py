"""FSDP2's MixedPrecisionPolicy (chapter 03): bytes gathered and reduced per step, measured on real
ranks, equal the prediction from the parameter count and the two dtypes."""
import pytest
import torch

from course_lib.common.models import get_config, param_count
from course_lib.launcher.launch import run
from course_lib.sharding.precision import fsdp2_demo

PSI = param_count(get_config("tiny"))
POLICIES = {"fp32": (None, None), "bf16 params, fp32 reduce": (torch.bfloat16, torch.float32),
            "bf16 params, bf16 reduce": (torch.bfloat16, torch.bfloat16)}


def predicted_policy_bytes(n_params, param_dtype, reduce_dtype):
    """Two all-gathers of the parameters in param_dtype, one reduce-scatter in reduce_dtype (None:
    param_dtype, FSDP2's documented default); no padding (the tiny GPT's rows divide by 2)."""
    param = param_dtype or torch.float32
    return {"all_gather": 2 * n_params * param.itemsize,
            "reduce_scatter": n_params * (reduce_dtype or param).itemsize}


@pytest.mark.parametrize("name", list(POLICIES))
def test_bytes_and_dtypes_sent_per_step_are_predicted(name):
    param_dtype, reduce_dtype = POLICIES[name]
    ranks = run(fsdp2_demo, 2, True, param_dtype, reduce_dtype, 2)
    want = predicted_policy_bytes(PSI, param_dtype, reduce_dtype)
    for rank in ranks:
        sent = rank["sent"]
        assert {k: v[0] for k, v in sent.items()} == want, name
        assert sent["all_gather"][1] == (param_dtype or torch.float32)
        assert sent["reduce_scatter"][1] == (reduce_dtype or param_dtype or torch.float32)
        assert rank["stored"] == rank["grad"] == torch.float32     # shards stay fp32 under every policy


def test_reduce_dtype_none_reduces_in_the_param_dtype():
    """FSDP2's documented default, checked on real ranks: no reduce_dtype -> bf16 reduction."""
    sent = run(fsdp2_demo, 2, True, torch.bfloat16, None, 2)[0]["sent"]
    assert sent["reduce_scatter"] == (PSI * 2, torch.bfloat16)


def test_keeping_the_parameters_gathered_sends_one_all_gather_less():
    sent = run(fsdp2_demo, 2, False, None, None, 2)[0]["sent"]
    assert sent["all_gather"][0] == 4 * PSI    # gathered once in forward, kept for backward
