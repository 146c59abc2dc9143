"""The exercise checks: pass on the right answer, fail (without leaking it) on wrong ones."""
import torch

from course_lib import RankError, check_choice, check_close, check_number, check_true


def test_check_number_passes_within_tolerance_and_never_prints_the_answer():
    assert check_number(1000, 1000)
    assert check_number(1004, 1000, rtol=0.01)
    for wrong, word in [(2000, "too high by exactly a factor of 2"), (10, "too low"), (1011, "too high")]:
        fb = check_number(wrong, 1000, rtol=0.01, hint="count the bytes per element")
        assert not fb and word in fb.message and "1000" not in repr(fb) and "1,000" not in repr(fb)
        assert "Hint: count the bytes" in fb.message
    assert "not answered yet" in check_number(..., 5).message
    assert "expected a number, got str" in check_number("5", 5).message
    assert check_number(torch.tensor(5.0), 5)


def test_check_close_reports_where_not_what():
    ref = torch.arange(6.0).reshape(2, 3)
    assert check_close(ref.clone(), ref)
    fb = check_close(ref + 1, ref)
    assert not fb and "Mismatched elements" in fb.message
    assert not check_close(torch.zeros(3), ref)
    assert "not answered yet" in check_close(..., ref).message


def test_check_choice_and_check_true():
    assert check_choice("zero2", "zero2", ["ddp", "zero2"])
    assert "is not one of" in check_choice("zero9", "zero2", ["ddp", "zero2"]).message
    assert not check_choice("ddp", "zero2", ["ddp", "zero2"])
    assert check_true(lambda: (True, "fine"))
    assert "raised ZeroDivisionError" in check_true(lambda: (1 / 0, "")).message

    def not_done():
        raise NotImplementedError
    assert "not answered yet" in check_true(not_done).message
    remote = RankError(3, 4, "NotImplementedError", "", "Traceback ...")
    assert "not answered yet" in check_true(lambda: (_ for _ in ()).throw(remote)).message
    remote = RankError(1, 4, "KeyError", "'w'", "Traceback ...")
    fb = check_true(lambda: (_ for _ in ()).throw(remote))
    assert "raised KeyError on rank 1" in fb.message and "Traceback" not in fb.message


def test_pass_fail_and_unanswered_differ_in_plain_capitals_and_in_colour():
    """Without an emoji font a learner still tells them apart: three different capital words."""
    ref = check_number(5, 5, name="n")
    wrong = check_number(6, 5, name="n")
    todo = check_number(..., 5, name="n")
    assert repr(ref).startswith("[n] PASS: ") and repr(wrong).startswith("[n] NOT YET: ")
    assert repr(todo).startswith("[n] TO DO: replace") and "not answered" not in repr(todo)
    colours = {f._repr_html_().split("background:")[1][:7] for f in (ref, wrong, todo)}
    assert len(colours) == 3
