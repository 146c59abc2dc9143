"""Chapter 08's "by default a tensor of at most 100,000 elements stays whole on every rank" in
ZeRO-3: DeepSpeed 0.19.8's default ``stage3_param_persistence_threshold`` (1e5) keeps a weight
of exactly 100,000 elements unpartitioned (``ds_persist``) and partitions one of 100,001."""
from __future__ import annotations

import pytest
from torch import nn

from course_lib.launcher.launch import run

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def _persisted():
    import warnings

    from course_lib.deepspeed.load import load_deepspeed
    deepspeed = load_deepspeed()
    warnings.filterwarnings("ignore")
    model = nn.Sequential(nn.Linear(1000, 100, bias=False), nn.Linear(100_001, 1, bias=False))
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    return [(p.ds_numel, bool(p.ds_persist)) for p in engine.module.parameters()]


def test_stage3_keeps_a_tensor_of_at_most_1e5_elements_whole():
    assert run(_persisted, 2) == [[(100_000, True), (100_001, False)]] * 2
