"""Chapter 11's DDP comm hooks on real ranks: each moves the predicted share of the plain
all-reduce's bytes (measured on the sockets), and the compressed runs end near its loss."""
from __future__ import annotations

import pytest
import torch

from course_lib.common.models import MLP
from course_lib.communicating_less.hooks import HOOKS, predicted_payload
from course_lib.communicating_less.measure import SIZES, compare_hooks

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")
HEADER_SLACK = 2048      # bytes per step: gloo's message headers, 3 all-reduces for PowerSGD
LOSS_DISTANCE = 0.05     # relative distance to the uncompressed loss after 22 steps


@pytest.fixture(scope="module")
def rows():
    return {r["hook"]: r for r in compare_hooks(HOOKS, steps=20)}


def test_prediction_counts_biases_uncompressed():
    shapes = [p.shape for p in MLP(SIZES).parameters()]
    n_bias = sum(s[0] for s in shapes if len(s) == 1)
    assert predicted_payload(shapes, "allreduce") == 4 * sum(s.numel() for s in shapes)
    assert predicted_payload(shapes, "powersgd_r1") == 4 * (
        n_bias + sum(s[0] + s[1] for s in shapes if len(s) == 2))
    # a matrix too small to gain twice is sent whole
    assert predicted_payload([torch.Size([4, 4])], "powersgd_r4") == 64


@pytest.mark.parametrize("hook", HOOKS)
def test_bytes_on_the_sockets_match_the_prediction(rows, hook):
    row = rows[hook]
    assert abs(row["sent"] - row["predicted_sent"]) <= 0.05 * row["predicted_sent"] + HEADER_SLACK
    expected_share = row["payload"] / rows["allreduce"]["payload"]
    assert row["share"] == pytest.approx(expected_share, rel=0.05, abs=0.01)


@pytest.mark.parametrize("hook", [h for h in HOOKS if h != "allreduce"])
def test_compressed_loss_near_uncompressed(rows, hook):
    base = rows["allreduce"]["loss"]
    assert abs(rows[hook]["loss"] - base) <= LOSS_DISTANCE * base
