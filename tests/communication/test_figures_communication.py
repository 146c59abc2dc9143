"""Chapter 05's conceptual figures are drawn from the objects beside them: the ring's recorded
messages on 2 and 4 real ranks give 2 and 6 steps, one cell per message; the α-β picture puts
its crossover at p·α/β of the fit it is given."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from course_lib.communication.alphabeta import AlphaBeta
from course_lib.communication.ring import ring_steps
from course_lib.communication.show import plot_alpha_beta, plot_ring_steps
from figure_checks import too_small  # noqa: E402


@pytest.mark.parametrize("p", [2, 4])
def test_ring_steps_follow_the_algorithm_and_the_figure_draws_them(p):
    messages = ring_steps(p)
    assert len(messages) == p * 2 * (p - 1)
    for m in messages:   # the textbook ring (Patarasuk & Yuan), written independently of ring.py
        s, r = m["step"], m["src"]
        assert m["dst"] == (r + 1) % p
        if s < p:        # reduce-scatter: chunk r-s+1 carries ranks r-s+1 .. r
            assert m["chunk"] == (r - s + 1) % p
            assert sorted(m["ranks"]) == sorted((r - k) % p for k in range(s))
        else:            # all-gather: complete chunks travel on
            assert m["chunk"] == (r + 1 - (s - p)) % p and len(m["ranks"]) == p
    fig = plot_ring_steps(messages)
    assert not too_small(fig)
    ax = fig.axes[0]
    assert len(ax.patches) == len(messages)
    assert len(ax.get_yticklabels()) == p and len(ax.get_xticklabels()) == 2 * (p - 1)
    phases = [t.get_text() for t in ax.texts if "(" in t.get_text()]
    assert phases == [f"reduce-scatter ({p - 1})", f"all-gather ({p - 1})"]


def test_alpha_beta_crossover_sits_at_p_alpha_over_beta():
    fits = {2: AlphaBeta(1e-4, 1 / 2e9), 4: AlphaBeta(3e-4, 1 / 1e9)}
    ax = plot_alpha_beta(fits).axes[0]
    crossings = sorted(line.get_xdata()[0] for line in ax.lines if len(set(line.get_xdata())) == 1)
    assert crossings == pytest.approx([2 * 1e-4 * 2e9, 4 * 3e-4 * 1e9])
    assert len(ax.lines) == 4 * len(fits)   # latency, bandwidth, total, crossover per world
    one = plot_alpha_beta({2: fits[2]}).axes[0]
    assert len(one.lines) == 4
