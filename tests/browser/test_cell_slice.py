"""The browser test runs only the cells a widget needs: check the slice on small notebooks."""
from cell_slice import binds_and_reads, cells_needed


def test_a_cell_is_needed_when_it_binds_what_a_needed_cell_reads():
    sources = [
        "import torch\nfrom course_lib import run",          # 0: needed through 2
        "results = run(measure, 4)",                           # 1: a measurement nobody reads
        "def helper(n):\n    return torch.ones(n)",           # 2: needed by 4
        "x = [1]\nx[0] = 2\nprint(x)",                        # 3: unrelated
        "def widget_fn(k):\n    return helper(k) + run(k)",   # 4: needed by the widget
        "interact(widget_fn, k=3)",                            # 5: the widget
    ]
    assert cells_needed(sources, 5) == [0, 2, 4]


def test_the_latest_binding_wins_unless_it_reads_the_earlier_one():
    assert cells_needed(["x = 1", "x = 2", "show(x)"], 2) == [1]
    assert cells_needed(["x = 1", "x = x + 1", "show(x)"], 2) == [0, 1]


def test_magics_builtins_and_arguments_need_nothing():
    binds, reads = binds_and_reads("%matplotlib inline\ndef f(model):\n    return len(model)\n")
    assert binds == {"f", "model"} and reads == set()
    assert cells_needed(["model = 1", "def f(model):\n    return model"], 1) == []
    assert binds_and_reads("this is not python(") == (set(), set())
