"""Chapter 05: strong scaling, 1 vs 2 pinned ranks, over an unshaped, a 1 Gbit/s and a 200 Mbit/s
link — the speedup falls as the link slows, near the band of α-β (unwidened in the verdict).

Needs network namespaces (skipped elsewhere with the reason, required in CI as root) and 2
usable cores. The band check needs the cores to be the ranks' own: when a measured core share
(the 1-rank step's, or the 2-rank step's on the unshaped link) is below :data:`MIN_CORE_SHARE`
(other programs hold the cores), that check is skipped with the shares, since the run then
measures the competition, not the link. A
measurement outside the band is repeated once before the tests judge the second one.
"""
from __future__ import annotations

import os

import pytest

from course_lib.common.models import mlp_param_count
from course_lib.communication import scaling_link as sl
from course_lib.launcher import netns, shaped_link
from course_lib.launcher.devices import usable_cores


@pytest.fixture(scope="module")
def rows():
    mode, why = netns.availability()
    if mode is None:
        if os.geteuid() == 0 and (os.environ.get("CI") == "true"
                                  or os.environ.get("COURSE_REQUIRE_NETNS") == "1"):
            pytest.fail(f"CI runs as root, so the shaped link must work here, but: {why}")
        pytest.skip(f"network namespaces not available here: {why}")
    if usable_cores() < 2:
        pytest.skip("strong scaling on 2 ranks needs 2 usable cores")
    rows = sl.scaling_over_link((0, 1000, 200), steps=5)
    if rows[0]["speedup"] < 1.4 or not all(-0.25 <= sl.band_gap(r) <= 0.15 for r in rows):
        # One more launch before judging: the unshaped 2-rank speedup once read 1.35 on the idle
        # CI machine, when the veth still had a 1500-byte MTU and its packet work took ~40 % of
        # a core (jumbo frames since: docs/decisions/communication.md, "Why the shaped link uses
        # jumbo frames"); a pinned rank's gloo thread can also
        # wait a scheduler slice behind the compute (the bubble's excess).
        rows = sl.scaling_over_link((0, 1000, 200), steps=5)
    return rows


def test_the_speedup_falls_as_the_link_slows(rows):
    fast, slow = rows[0], rows[-1]
    assert all(r["cores"][0] != r["cores"][1] for r in rows)
    wire = slow["predicted_comm_s"] - fast["predicted_comm_s"]  # 4Ψ·8 / 200 Mbit/s
    assert slow["allreduce_s"] >= fast["allreduce_s"] + 0.8 * wire, slow  # the link is the limit
    _skip_if_busy(rows)  # the step times below need the ranks' cores (a run at 13 % share failed)
    assert slow["t2_s"] >= fast["t2_s"] + 0.3 * wire, (fast, slow)  # overlap hides < 70 %
    assert slow["speedup"] < fast["speedup"], rows


#: How far outside the unwidened α-β band a speedup may lie before the test fails (the notebook's
#: verdict says "not as predicted", by how much, at any distance). Idle runs: +6 %, -8 %, 0 % and
#: -16 %, -9 %, -6 % (below: half the batch costs more than half the compute, and DDP's reducer
#: adds its own work; docs/decisions/communication.md, "Why the scaling verdict uses α-β's own
#: band").
BELOW, ABOVE = -0.25, 0.15


def _skip_if_busy(rows):
    shares = sl.core_shares(rows)
    if min(shares) < sl.MIN_CORE_SHARE:
        pytest.skip(f"the ranks had their cores only {min(shares):.0%} of the time (CPU / wall, "
                    f"measured: 1-rank steps {[f'{s:.0%}' for s in shares[:-1]]}, 2-rank step on "
                    f"the unshaped link {shares[-1]:.0%}): a busy machine, not the link")


def test_each_speedup_lies_within_the_alpha_beta_band(rows):
    _skip_if_busy(rows)
    assert rows[0]["speedup"] >= 1.4, rows[0]  # 2 cores, a fast link: close to 2
    assert all(BELOW <= sl.band_gap(r) <= ABOVE for r in rows), rows
    verdict = sl.scaling_verdict(rows)
    assert ("not as predicted" not in verdict) == all(sl.within_band(r) for r in rows), verdict


def test_the_band_is_not_widened():
    # Chapter 05 once printed "each within ×1.25 of α-β: as predicted" for speedups 1.56, 1.34,
    # 0.82 against no-overlap predictions 1.86, 1.48, 0.87: all three lie below the band.
    rows = [{"rate_mbit": rate, "speedup": s, "predicted_speedup_serial": lo,
             "predicted_speedup_overlap": hi, "core_share": 0.99, "shared_core": False}
            for rate, s, lo, hi in ((0, 1.56, 1.86, 2.0), (1000, 1.34, 1.48, 2.0),
                                    (200, 0.82, 0.87, 1.54))]
    assert not any(sl.within_band(r) for r in rows)
    assert [round(sl.band_gap(r), 2) for r in rows] == [-0.16, -0.09, -0.06]
    verdict = sl.scaling_verdict(rows)
    assert "not as predicted" in verdict and "16% below" in verdict, verdict
    assert "falls as the link slows" in verdict, verdict
    above = {**rows[0], "speedup": 2.12}
    assert sl.band_gap(above) == pytest.approx(0.06) and "6% above" in sl.scaling_verdict(
        [above, *rows[1:]])


def test_predictions_come_from_the_baseline_and_the_link_not_from_the_two_rank_step(rows):
    psi = mlp_param_count(sl.LINK_SIZES)
    for r in rows:
        comm = rows[0]["allreduce_s"] + (4 * psi * 8 / (r["rate_mbit"] * 1e6)
                                         if r["rate_mbit"] else 0)
        assert r["predicted_comm_s"] == pytest.approx(comm)
        assert r["predicted_speedup_serial"] == pytest.approx(r["t1_s"] / (r["t1_s"] / 2 + comm))
        assert r["speedup"] == pytest.approx(r["t1_s"] / r["t2_s"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(rates_mbit=(1000, 200)), "must start with 0"),
    (dict(rates_mbit=(0, -5)), "must start with 0"),
    (dict(global_batch=1025), "split evenly"),
    (dict(steps=0), "steps must be a positive integer"),
])
def test_bad_input_fails_before_any_process(monkeypatch, kwargs, message):
    monkeypatch.setattr(shaped_link, "run_pair", lambda *a, **k: pytest.fail("a process started"))
    with pytest.raises(ValueError, match=message):
        sl.scaling_over_link(**kwargs)


def test_the_verdict_names_what_spoiled_the_run():
    row = {"rate_mbit": 0.0, "speedup": 1.9, "core_share": 0.95, "shared_core": False,
           "predicted_speedup_serial": 1.8, "predicted_speedup_overlap": 2.0}
    slow = {**row, "rate_mbit": 200.0, "speedup": 0.9, "predicted_speedup_serial": 0.85,
            "predicted_speedup_overlap": 1.2}
    assert "as predicted" in sl.scaling_verdict([row, slow])
    assert "not as predicted" not in sl.scaling_verdict([row, slow])
    assert "does not fall" in sl.scaling_verdict([slow, row])
    two_busy = sl.scaling_verdict([{**row, "t2_core_share": 0.5}, slow])
    assert "only 50% of the time" in two_busy, two_busy
    assert "only 30% of the time" in sl.scaling_verdict([{**row, "core_share": 0.3}, slow])
    assert "needs 2 usable cores" in sl.scaling_verdict([{**row, "shared_core": True}, slow])
