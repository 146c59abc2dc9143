"""Chapter 1's widget is plain functions behind dropdowns: the functions are tested here, directly."""
import matplotlib
import pytest

matplotlib.use("Agg")

from course_lib.common.models import RECOMPUTE, param_count, get_config  # noqa: E402
from course_lib.memory import predict  # noqa: E402
from course_lib.memory.show import (inference_explorer, memory_explorer, memory_widget,  # noqa: E402
                                    plot_recompute, show_memory_explorer, training_vs_inference)


@pytest.mark.parametrize("precision,recompute", [("mixed", "full"), ("mixed-fp32-grads", "selective")])
def test_the_explorer_measures_mixed_precision_and_recomputation_as_predicted(precision, recompute):
    report, predicted = memory_explorer("tiny", 4, 32, precision=precision, recompute=recompute)
    assert report.info["precision"] == precision and report.info["recompute"] == recompute
    n = param_count(get_config("tiny"))
    assert report["params"] == 2 * n  # bf16 weights, counted from the size alone
    for key in ("params", "grads", "optimizer", "activations"):
        assert report[key] == predicted[key], key
    assert report["peak"] == pytest.approx(predicted["peak"], rel=0.10)


@pytest.mark.parametrize("precision,weight_bytes", [("fp32", 4), ("mixed", 2)])
def test_the_inference_row_holds_the_weights_and_training_needs_more(precision, weight_bytes):
    inference = inference_explorer("tiny", 4, 32, precision=precision)
    training, _ = memory_explorer("tiny", 4, 32, precision="fp32" if precision == "fp32" else "mixed")
    assert inference.info["mode"] == "inference"
    assert inference["params"] == weight_bytes * param_count(get_config("tiny"))
    assert inference["grads"] == inference["optimizer"] == 0
    assert training["peak"] > 2 * inference["peak"]
    text = training_vs_inference(training, inference)
    assert f"{training['peak']:,} B" in text and f"{inference['peak']:,} B" in text
    assert f"{training['peak'] / inference['peak']:.1f}× the memory of inference" in text


def test_show_explains_a_bad_combination_instead_of_raising(capsys):
    show_memory_explorer("tiny", 2, 16, precision="mixed", optimizer="sgd")
    assert "keeps fp32 master weights for Adam" in capsys.readouterr().out


def test_the_widget_offers_every_precision_and_recompute_mode():
    widget = memory_widget()
    options = {child.description: tuple(child.options) for child in widget.children
               if hasattr(child, "options")}
    assert options["precision"] == predict.ALL_PRECISIONS
    assert options["recompute"] == RECOMPUTE


def test_the_recompute_figure_draws_bytes_only():
    from course_lib.memory.recompute import tradeoff
    rows = tradeoff("tiny", [(2, 16)], modes=("none", "full"), repeats=0)
    assert all("step_s" not in r for r in rows)
    assert [r["activations"] for r in rows] == [r["activations_predicted"] for r in rows]
    fig = plot_recompute("tiny", rows, batch_sizes=(1, 2, 4), seq_len=16)
    assert [ax.get_ylabel().split(" ")[0] for ax in fig.axes] == ["activations", "peak"]
