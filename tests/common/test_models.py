"""Chapter 1 model family: parameter-count formula, validation, submodule names."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from course_lib.common.models import (GPT, MLP, PRESETS, GPTConfig, get_config, mlp_param_count,
                                      param_count)


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", ["tiny", "small", "medium"])
@pytest.mark.parametrize("bias,tie", [(True, False), (False, False), (True, True)])
def test_param_count_matches_built_model(name, bias, tie):
    config = PRESETS[name].replace(bias=bias, tie_weights=tie)
    assert param_count(config) == n_params(GPT(config))


def test_param_count_of_7b_preset_on_fake_tensors():
    with FakeTensorMode():
        model = GPT(PRESETS["gpt-7b"])
    assert param_count(PRESETS["gpt-7b"]) == n_params(model) == 6_864_642_048


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_layer=2, n_head=3, d_model=64), "n_head=3 must divide d_model=64"),
    (dict(n_layer=-1, n_head=2, d_model=64), "n_layer must be a positive integer, got -1"),
    (dict(n_layer=2, n_head=2, d_model=0), "d_model must be a positive integer, got 0"),
    (dict(n_layer=2, n_head=2, d_model=64, vocab_size=2.5), "vocab_size must be a positive integer"),
    (dict(n_layer=2, n_head=2, d_model=64, seq_len=True), "seq_len must be a positive integer"),
    (dict(n_layer=2, n_head=2, d_model=64, attention="flash3"), "attention must be one of"),
])
def test_bad_config_raises_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**kwargs)


def test_unknown_preset_and_too_long_sequence():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        get_config("huge")
    model = GPT(PRESETS["tiny"])
    with pytest.raises(ValueError, match="exceeds config.seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_submodule_names_for_later_chapters():
    c = PRESETS["tiny"]
    model = GPT(c)
    modules = dict(model.named_modules())
    h = c.d_model
    for i in range(c.n_layer):
        assert modules[f"blocks.{i}.attn.qkv"].weight.shape == (3 * h, h)
        assert modules[f"blocks.{i}.attn.proj"].weight.shape == (h, h)
        assert modules[f"blocks.{i}.mlp.fc"].weight.shape == (4 * h, h)
        assert modules[f"blocks.{i}.mlp.proj"].weight.shape == (h, 4 * h)
    assert isinstance(model.blocks, torch.nn.ModuleList)
    for name in ("tok_emb", "pos_emb", "ln_f", "lm_head"):
        assert name in modules
    assert model.lm_head.weight is not model.tok_emb.weight  # untied by default (FSDP2 per block)


def test_sdpa_and_explicit_attention_agree_and_are_causal():
    torch.manual_seed(0)
    sdpa = GPT(PRESETS["tiny"])
    explicit = GPT(PRESETS["tiny"].replace(attention="explicit"))
    explicit.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, 256, (2, 40))
    torch.testing.assert_close(sdpa(idx), explicit(idx), rtol=1e-4, atol=1e-5)
    changed = idx.clone()
    changed[:, 30:] = (changed[:, 30:] + 1) % 256  # future tokens must not change earlier logits
    torch.testing.assert_close(sdpa(changed)[:, :30], sdpa(idx)[:, :30])


def test_dtype_argument_builds_bf16_weights():
    model = GPT(PRESETS["tiny"], dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    loss = GPT.loss(model(torch.zeros(1, 8, dtype=torch.long)), torch.zeros(1, 8, dtype=torch.long))
    assert loss.dtype == torch.float32


def test_mlp_param_count_and_validation():
    sizes = [32, 64, 64, 1]
    mlp = MLP(sizes)
    assert n_params(mlp) == mlp_param_count(sizes) == 32 * 64 + 64 + 64 * 64 + 64 + 64 + 1
    assert [n for n, _ in mlp.named_children()] == ["fc0", "act0", "fc1", "act1", "fc2"]
    with pytest.raises(ValueError, match="at least two positive integers"):
        MLP([32])
    with pytest.raises(ValueError, match="at least two positive integers"):
        MLP([32, -4])
