"""Chapter 1's bytes-per-parameter picture, drawn from measured reports of two different setups."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.memory.show import plot_bytes_per_param  # noqa: E402
from course_lib.memory.tracker import measure_step  # noqa: E402
from figure_checks import patches, too_small  # noqa: E402


@pytest.fixture(scope="module")
def reports():
    return {(p, o): measure_step("tiny", (2, 16), precision=p, optimizer=o)
            for p, o in (("fp32", "adam"), ("fp32", "sgd"), ("bf16", "adam"))}


def _squares(fig, row):
    return {k: len(patches(fig, f"byte-{row}-{k}")) for k in ("params", "grads", "optimizer")}


def test_one_square_per_measured_byte_per_parameter(reports):
    fig = plot_bytes_per_param({f"{p} · {o}": r for (p, o), r in reports.items()})
    assert [_squares(fig, row) for row in range(3)] == [
        {"params": 4, "grads": 4, "optimizer": 8},      # fp32 Adam: the 16 bytes
        {"params": 4, "grads": 4, "optimizer": 0},      # SGD keeps no state
        {"params": 2, "grads": 2, "optimizer": 4}]      # bf16 Adam
    assert not too_small(fig)
    plt.close(fig)


def test_the_rows_follow_the_reports_passed_in(reports):
    fig = plot_bytes_per_param({"bf16 · adam": reports["bf16", "adam"]})
    assert _squares(fig, 0) == {"params": 2, "grads": 2, "optimizer": 4}
    assert not patches(fig, "byte-1-")
    plt.close(fig)
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_bytes_per_param({})
