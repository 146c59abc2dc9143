"""A rank's return value comes back whole, and its tensors without extra copies (issue 50)."""
from __future__ import annotations

import tracemalloc

import pytest
import torch
import torch.distributed as dist

from course_lib.launcher import _rank_pipes, _results
from course_lib.launcher.launch import run

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")
MB = 1 << 20


def _values():
    t = torch.arange(12, dtype=torch.float32)
    return {"float": t, "view": t[::3], "transposed": t.reshape(3, 4).t(),
            "bf16": t.to(torch.bfloat16), "bool": t > 4, "int": torch.arange(5),
            "conj": torch.complex(t, -t).conj(), "scalar": torch.tensor(2.5),
            "empty": torch.empty(0, 3), "parameter": torch.nn.Parameter(torch.ones(2)),
            "needs_grad": torch.ones(2, requires_grad=True), "twice": (t, t), "text": "ok"}


def _check(got: dict) -> None:
    want = _values()
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert type(got[name]) is type(value) and got[name].dtype == value.dtype, name
            assert got[name].shape == value.shape and torch.equal(got[name], value), name
            assert got[name].requires_grad == value.requires_grad, name
    assert got["twice"][0] is got["twice"][1] and got["text"] == "ok"


def _through_a_message(value):
    raw = bytearray(b"".join(_results.message((("ok",), []), _results.dumps(value))))
    (outcome, stamps), value_pickle = _results.read(raw)
    return _results.loads(value_pickle)


def test_tensors_of_every_kind_come_back_equal():
    _check(_through_a_message(_values()))


def _values_of_rank():
    return _values(), dist.get_rank()


def test_a_run_returns_the_ranks_tensors():
    for got, rank in run(_values_of_rank, 2):
        _check(got)


def test_the_notebooks_side_holds_one_copy_of_a_returned_tensor():
    """Reading a 4 MB tensor out of the rank's message allocates one 4 MB buffer, which the
    tensor then uses: torch's own pickling (through ``torch.save``'s bytes, inside the pickled
    message) allocated two (~8 MB)."""
    t = torch.randn(MB)
    raw = bytearray(b"".join(_results.message((("ok",), []), _results.dumps(t))))
    tracemalloc.start()
    try:
        (_, _), value_pickle = _results.read(raw)
        got = _results.loads(value_pickle)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert torch.equal(got, t)
    assert peak < 1.25 * t.nbytes, f"{peak / MB:.1f} MB allocated for a {t.nbytes / MB:.0f} MB tensor"
    assert held >= t.nbytes  # that buffer is the tensor's memory (torch.load would allocate more)
    assert len(_results.dumps(t)) < t.nbytes + 1024  # the raw bytes, no copy of torch.save's


def test_a_message_cut_short_reads_as_none():
    raw = b"".join(_results.message((("ok",), []), _results.dumps(torch.ones(1000))))
    for cut in (0, 10, len(raw) // 2, len(raw) - 1):
        assert _results.read(bytearray(raw[:cut])) is None
    assert _rank_pipes._unpickle(bytearray(raw[:-1])) == (None, [])
    assert _rank_pipes._unpickle(bytearray(raw))[0][0] == "ok"


def test_an_error_message_has_no_value():
    raw = bytearray(b"".join(_results.message(((("error", "ValueError", "no", "tb")), []))))
    assert _rank_pipes._unpickle(raw) == (("error", "ValueError", "no", "tb"), [])
