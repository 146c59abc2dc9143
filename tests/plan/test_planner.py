"""The planner: configs refused by field, the enumeration, block scaling against a full build,
and torchtitan's published Llama 3.1 8B run on 8 H100."""
from __future__ import annotations

import json

import pytest

from course_lib.common.published import published
from course_lib.plan.__main__ import main
from course_lib.plan.fake_step import run_stage
from course_lib.plan.layouts import Candidate, enumerate_layouts
from course_lib.plan.models import STORED, ConfigError, load_config, model_spec
from course_lib.plan.planner import clear_cache, measure_layout, plan

#: a Llama with the real one's structure (GQA, SwiGLU, RoPE), small enough for a test
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 8,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 1024, "tie_word_embeddings": False}


def test_the_stored_configs_read_with_their_published_shapes():
    assert set(STORED) == {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b-v0.1",
                           "mixtral-8x7b-v0.1", "qwen2.5-7b-instruct"}
    spec = model_spec(load_config("llama-3.1-70b"))
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.ffn, spec.vocab) == \
        (80, 8192, 64, 8, 28672, 128256)
    moe = model_spec(load_config("mixtral-8x7b-v0.1"))
    assert moe.moe and (moe.experts, moe.top_k) == (8, 2)


@pytest.mark.parametrize("change, field", [
    ({"hidden_size": 0}, "'hidden_size'"),
    ({"num_hidden_layers": "32"}, "'num_hidden_layers'"),
    ({"num_key_value_heads": 3}, "'num_key_value_heads'"),
    ({"model_type": "not-a-model"}, "'model_type'"),
    ({"auto_map": {"AutoConfig": "x.Config"}}, "'auto_map'"),
])
def test_a_config_it_cannot_build_is_refused_naming_the_field(change, field, tmp_path, capsys):
    bad = {**TINY, **change}
    with pytest.raises(ConfigError, match=field):
        model_spec(load_config(bad))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(bad))
    assert main([str(path), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and err.strip().count("\n") == 0


def test_a_bad_request_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="gpus_per_node"):
        plan(TINY, gpus=12, gpus_per_node=8)
    with pytest.raises(ValueError, match="efficiency"):
        plan(TINY, gpus=8, efficiency=1.5)


def test_every_layout_uses_every_gpu_and_respects_the_model():
    spec = model_spec(load_config("mixtral-8x7b-v0.1"))
    layouts = enumerate_layouts(16, 8, spec, global_batch=16, seq_len=8192)
    assert layouts and all(c.world == 16 for c in layouts)
    assert all(c.tp <= 8 and spec.kv_heads % c.tp == 0 and 16 % (c.dp) == 0 for c in layouts)
    assert all(spec.experts // c.ep >= spec.top_k and c.fsdp % c.ep == 0 for c in layouts)
    assert {c.ep for c in layouts} == {1, 2, 4}
    assert any(c.dp_replicate > 1 for c in layouts) and any(c.pp > 1 for c in layouts)


#: a Llama 1024 wide: fake tensors cost nothing, and activations then dominate as at scale
SMALL = {**TINY, "hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 8,
         "num_key_value_heads": 4, "vocab_size": 8192, "num_hidden_layers": 5}


@pytest.mark.parametrize("layout", [
    Candidate(dp_shard=4), Candidate(dp_shard=4, ac="selective"), Candidate(dp_shard=4, ac="full"),
    Candidate(dp_shard=2, tp=2, ac="full"), Candidate(dp_shard=2, pp=2, ac="full"),
], ids=lambda c: f"{c.label}-{c.ac}")
def test_measuring_two_depths_and_scaling_matches_the_full_build(layout):
    """Three and four blocks, scaled to eight, give the full build's peak to the byte. It failed
    (+14 % selective, -21 % full with TP, 179 GiB for Llama 3.1 70B) while torch's FLOP counter
    tracked modules: its hooks' reference cycles kept recomputed blocks alive (fake_step.py)."""
    config = load_config({**SMALL, "num_hidden_layers": 8 * layout.pp})  # 8 blocks a stage
    spec = model_spec(config)
    clear_cache()
    scaled, _, runs = measure_layout(config, layout, spec, global_batch=8, seq_len=1024)
    full, _, full_runs = measure_layout(config, layout, spec, global_batch=8, seq_len=1024, depth=8)
    assert (runs, full_runs) == (2 * (1 + (layout.pp > 1)), 1 + (layout.pp > 1))
    assert scaled.peak == full.peak
    assert scaled.flops == pytest.approx(full.flops, rel=1e-9)
    assert sum(b for b, _ in scaled.comm.values()) == pytest.approx(
        sum(b for b, _ in full.comm.values()), rel=1e-9)


def test_torchtitan_llama_8b_on_8_h100_fits_within_15_percent_of_its_memory(capsys):
    ref = next(e for e in published("07") if e["id"] == "torchtitan-llama31-8b-fsdp")
    p = plan("llama-3.1-8b", gpus=8, cluster="h100-96gb", global_batch=16, seq_len=8192,
             layouts=[Candidate(dp_shard=8, ac="selective")])
    row = p.rows[0]
    assert row.layout.ac == "selective" and row.fits
    assert row.need_gib == pytest.approx(ref["memory_gib"], rel=0.15)
    from course_lib.plan.show import compare_published
    print(compare_published(row, ref), f"(efficiency {p.assumptions['compute']})")
    assert "5,762" in capsys.readouterr().out


@pytest.mark.parametrize("measured, composed", [
    (Candidate(dp_shard=2, tp=2), Candidate(dp_shard=4, tp=2)),
    (Candidate(dp_replicate=2, dp_shard=2), Candidate(dp_replicate=2, dp_shard=4)),
    (Candidate(dp_shard=4, pp=2), Candidate(dp_shard=2, pp=4)),
], ids=["fsdp-tp", "hsdp", "pp"])
def test_a_layout_composed_from_a_cached_block_shape_matches_its_own_build(measured, composed):
    """Layouts that differ only in dp_shard/dp_replicate/pp share their fake block runs: the
    composed figure (sharded bytes rescaled, groups mapped) equals a fresh measurement."""
    config = load_config({**SMALL, "num_hidden_layers": 16})  # PP 4: 4 blocks, built at a measured depth
    spec = model_spec(config)
    micro = 2 if composed.pp == 1 else 1  # the same sequences per rank in both layouts
    clear_cache()
    measure_layout(config, measured, spec, global_batch=micro * measured.dp * 2, seq_len=1024)
    batch = micro * composed.dp * 2
    cached, _, runs = measure_layout(config, composed, spec, global_batch=batch, seq_len=1024)
    clear_cache()
    fresh, _, fresh_runs = measure_layout(config, composed, spec, global_batch=batch, seq_len=1024)
    assert runs == 0 and fresh_runs > 0
    assert cached.peak == pytest.approx(fresh.peak, rel=0.01)
    assert cached.flops == pytest.approx(fresh.flops, rel=1e-6)
    assert set(cached.comm) == set(fresh.comm)
    for key, (n_bytes, calls) in fresh.comm.items():
        assert cached.comm[key][1] == calls and cached.comm[key][0] == pytest.approx(n_bytes, rel=0.01)


@pytest.mark.parametrize("shared, own", [
    (Candidate(dp_shard=4), Candidate(dp_replicate=2, dp_shard=2)),
    (Candidate(dp_shard=4, ac="full"), Candidate(dp_replicate=2, dp_shard=2, ac="full")),
    (Candidate(dp_shard=4), Candidate(dp_shard=2, cp=2)),
], ids=["hsdp-from-fsdp", "hsdp-from-fsdp-full", "cp-from-fsdp"])
def test_hsdp_and_context_parallel_rows_borrowed_from_fsdp_match_their_own_fake_step(shared, own):
    """HSDP is measured as FSDP over its shard group (its replicas add an all-reduce of each
    gradient shard: counted on its own fake step too) and CP 2 as FSDP with the same tokens per
    rank in twice the sequences (only attention's FLOPs differ, rescaled): the borrowed figures
    equal the layout's own fake step (a full build: 4 blocks)."""
    config = load_config({**SMALL, "num_hidden_layers": 4})
    spec = model_spec(config)
    batch = 2 * own.cp * own.dp  # the same tokens per rank: 2 × 1024, or 4 × 512 with CP 2
    clear_cache()
    measure_layout(config, shared, spec, global_batch=2 * shared.dp, seq_len=1024)
    borrowed, _, runs = measure_layout(config, own, spec, global_batch=batch, seq_len=1024)
    fresh = run_stage(config, own, depth=4, first=True, last=True, micro_batch=batch // own.dp,
                      seq_len=1024, in_flight=1)
    assert runs == 0
    # HSDP's own step holds a few hundred bytes more (156 here); CP's borrowed peak is +1.0 %
    # here (4 × 512 tokens measured as 2 × 1024), -0.2 % for Llama 3.1 70B
    assert borrowed.peak == pytest.approx(fresh.peak, rel=0.02 if own.cp > 1 else 1e-6)
    assert borrowed.flops == pytest.approx(fresh.flops, rel=1e-9)
    assert borrowed.attention_flops == pytest.approx(fresh.attention_flops, rel=1e-9)
    assert set(borrowed.comm) == set(fresh.comm)
    for key, (n_bytes, calls) in fresh.comm.items():
        assert borrowed.comm[key] == (pytest.approx(n_bytes, rel=1e-9), calls)


def test_a_table_plans_tensor_parallel_stages_after_other_meshes():
    """DTensor caches sharding plans by meshes that compare equal across fake process groups: a
    plan cached in an earlier layout's run sent on a destroyed group ("Could not resolve the
    process group registered under the name 25", seen with these two layouts in a row)."""
    layouts = [Candidate(dp_shard=2, tp=2, pp=2), Candidate(tp=2, pp=4)]
    p = plan({**SMALL, "num_hidden_layers": 8}, gpus=8, global_batch=16, seq_len=1024, layouts=layouts)
    assert {r.layout.tp for r in p.rows} == {2} and len(p.rows) == 2
