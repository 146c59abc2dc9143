"""Progress and folded logs: which lines stream, which fold (per rank), and silence outside Jupyter."""
from __future__ import annotations

import io

import torch.distributed as dist

from course_lib import progress, run
from course_lib.launcher.progress import View, fold, render_fold, status_line


def test_fold_shows_the_first_lines_in_arrival_order_and_groups_the_rest_per_rank():
    lines = [(i % 3, f"step {i}") for i in range(26)]
    assert fold(lines, head=20) == {2: ["step 20", "step 23"], 0: ["step 21", "step 24"],
                                    1: ["step 22", "step 25"]}
    few = fold(lines[:20], head=20)
    assert few == {} and render_fold(few) == ""


def test_render_fold_escapes_and_names_count_and_last_line_per_rank():
    lines = [(1, "shown"), (None, "agent up"), (1, "a"), (1, "loss <0.5> & done"), (0, "b")]
    markup = render_fold(fold(lines, head=1))
    assert markup.count("<details>") == 3  # one per rank, the launcher's own lines first
    assert markup.index("[torchrun]") < markup.index("[rank 0]") < markup.index("[rank 1]")
    assert "[rank 1]: 2 more lines · last: <code>loss &lt;0.5&gt; &amp; done</code>" in markup
    assert "[rank 0]: 1 more line · last" in markup and "shown" not in markup


def test_status_line_shows_a_bar_only_when_the_total_is_known():
    assert "<progress value='3' max='4'" in status_line("run", 2.5, 3, 4, "ranks done", "", "running")
    line = status_line("bench <x>", 12.34, None, None, "steps", "size 4 MB", "done")
    assert line == "✔ <b>bench &lt;x&gt;</b> · 12.3 s · size 4 MB"


drawn: list[str] = []  # what the view drew, in place of the notebook display


def _recorder(markup: str):
    drawn[:] = [markup]
    return drawn.append


def test_a_watched_run_streams_the_head_folds_the_rest_and_consumes_progress_reports(monkeypatch):
    monkeypatch.setattr(progress, "_target", _recorder)
    view, out = View("run on 2 ranks", 2, "ranks done", delay=0.0, head=3, live=True), io.StringIO()
    results = [view.line(i % 2, f"line {i}", out) for i in range(5)]
    assert view.line(0, "\x1b]course-progress;7/10\x07", out) is False
    assert results == [True] * 5
    assert out.getvalue() == "[rank 0] line 0\n[rank 1] line 1\n[rank 0] line 2\n"
    view.update(done=2)
    view.close("done")
    final = drawn[-1]
    assert "✔ <b>run on 2 ranks</b>" in final and "2/2 ranks done" in final
    assert "step 7/10 (rank 0)" in final
    assert "[rank 1]: 1 more line · last: <code>line 3</code>" in final
    assert "[rank 0]: 1 more line · last: <code>line 4</code>" in final


def test_a_short_quiet_run_draws_nothing(monkeypatch):
    monkeypatch.setattr(progress, "_target", _recorder)
    drawn.clear()
    view = View("run", 2, "ranks done", delay=60.0, head=20, live=True)
    view.line(0, "hello", io.StringIO())
    view.tick()
    view.close("done")
    assert drawn == []


def test_an_inner_run_reports_into_the_outer_line(monkeypatch):
    monkeypatch.setattr(progress, "interactive", lambda: True)
    monkeypatch.setattr(progress, "_target", _recorder)
    with progress.watch("benchmark", 3, "sizes", delay=0.0) as outer:
        with progress.watch("run on 4 ranks", 4) as inner:
            assert not inner.live
            inner.update(done=1)
            assert outer.note == "run on 4 ranks: 1/4 ranks done"
        assert outer.note == ""


def _chatty():
    if dist.get_rank() == 0:
        progress.report(1, 2)
    for i in range(30):
        print(f"line {i}")
    return dist.get_rank()


def test_outside_jupyter_lines_pass_through_unchanged_and_reports_vanish(capfd):
    assert not progress.interactive()
    assert run(_chatty, 2) == [0, 1]
    out = capfd.readouterr().out.splitlines()
    assert sorted(out) == sorted(f"[rank {r}] line {i}" for r in range(2) for i in range(30))
