"""A rank that dies in a collective: one line first, its raw dump folded (issue 33, item 6).

The dump a dying process writes (gloo's ``EnforceNotMet``, "Fatal Python error", thread dumps)
is held back from the cell and shown under the summary: below it as text, behind a
``<details>`` toggle in HTML — in ``run``'s ``RankError`` and in an exercise check's verdict
(chapter 09's ``all_to_all`` answer that receives as many rows as it sends)."""
from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.distributed as dist

from course_lib.composition.exercises import check_exchange
from course_lib.exercises import Feedback, check_true
from course_lib.launcher import _rank_error
from course_lib.launcher._rank_error import Folded, RankError
from course_lib.launcher.launch import run

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def test_folded_text_puts_the_raw_dump_below_and_html_folds_it():
    view = Folded("rank 1 died <here>", "Fatal Python error: Aborted\n  & more", "raw output")
    assert repr(view) == "rank 1 died <here>\n--- raw output ---\nFatal Python error: Aborted\n  & more"
    markup = view._repr_html_()
    assert markup.index("rank 1 died &lt;here&gt;") < markup.index("<details><summary>raw output")
    assert "  &amp; more</pre></details>" in markup
    assert "<details>" not in Folded("all fine")._repr_html_()


def test_a_rank_error_starts_with_its_summary_and_ends_with_the_dump():
    err = RankError(1, 2, "ProcessDied", "killed by signal 6", "(no traceback)",
                    "rank 1 died in a collective", "terminate called\nFatal Python error")
    lines = str(err).splitlines()
    assert lines[0] == "rank 1 died in a collective"
    assert lines[-4:] == ["--- raw output of rank 1 as it died (2 lines) ---", "terminate called",
                          "Fatal Python error", "--- the other ranks were stopped ---"]
    assert "<details><summary>raw output of rank 1" in err.view()._repr_html_()


def _mismatched():
    dist.all_reduce(torch.ones(6 if dist.get_rank() == 0 else 4))


def test_a_rank_killed_in_a_collective_shows_one_line_and_its_dump_only_in_the_error(capsys):
    with pytest.raises(RankError) as info:
        run(_mismatched, 2)
    err = info.value
    assert str(err).splitlines()[0] == err.summary
    assert err.summary.startswith("rank 1 died in a collective: it received 8 bytes where 4")
    assert err.raw.startswith("terminate called after throwing an instance of 'gloo::EnforceNotMet'")
    assert "Fatal Python error: Aborted" in err.raw
    streamed = capsys.readouterr().err
    assert "Fatal Python error" not in streamed and "EnforceNotMet" not in streamed


def _receives_as_many_rows_as_it_sends(rows, send_counts):
    out = torch.empty_like(rows)
    dist.all_to_all_single(out, rows, send_counts.tolist(), send_counts.tolist())
    return out


def test_chapter_09s_wrong_all_to_all_gets_a_one_line_verdict_with_the_dump_folded(capsys):
    fb = check_true(lambda: check_exchange(_receives_as_many_rows_as_it_sends), name="a2a")
    assert not fb and "\n" not in fb.message
    assert fb.message == ("your code failed: rank 1 died in a collective: it received 1536 bytes "
                          "where 1152 were expected: the ranks disagree on a collective's sizes "
                          "(shapes, dtypes or split sizes; run(..., debug='detail') compares "
                          "shapes and dtypes, not splits)")
    assert "EnforceNotMet" in fb.details and repr(fb).splitlines()[0] == f"[a2a] NOT YET: {fb.message}"
    assert "<details><summary>what your code left: traceback and raw output" in fb._repr_html_()
    assert "Fatal Python error" not in capsys.readouterr().err
    assert "<details>" not in Feedback(True, "fine")._repr_html_()  # no dump: just the badge line


def test_in_a_kernel_an_uncaught_rank_error_is_shown_through_its_view(monkeypatch):
    import IPython.display
    calls, shown = [], []
    shell = types.SimpleNamespace(kernel=object(), custom_exceptions=(),
                                  set_custom_exc=lambda exc, handler: calls.append((exc, handler)))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    _rank_error.show_in_notebook()
    assert calls == [((RankError,), _rank_error._handler)]
    monkeypatch.setattr(IPython.display, "display", shown.append)
    err = RankError(1, 2, "ProcessDied", "x", "tb", "rank 1 died in a collective", "dump")
    assert _rank_error._handler(shell, RankError, err, None) == [
        "\x1b[0;31mRankError\x1b[0m: rank 1 died in a collective"]
    assert repr(shown[0]) == repr(err.view())
    shell.custom_exceptions = (ValueError,)  # somebody else's handler stays
    _rank_error.show_in_notebook()
    assert len(calls) == 1
