"""Chapter 12's stored longer run writes text most of whose words are words of the corpus, and
says how it was made (issue 59, item 7)."""
from __future__ import annotations

from course_lib.capstone.sample import corpus_words, word_overlap
from course_lib.capstone.whole_game import stored_record


def test_the_stored_sample_reads_mostly_in_words_of_the_corpus():
    run = stored_record("capstone_long_run")
    assert word_overlap(run["after"]) > 0.5
    assert len(run["after"]) >= 300 and run["word_overlap"] == round(word_overlap(run["after"]), 3)


def test_the_stored_run_is_labelled_and_its_loss_fell():
    run = stored_record("capstone_long_run")
    assert {"date", "machine", "settings", "what"} <= set(run)
    assert run["settings"]["steps"] >= 500 and run["losses_every_50"][-1] < 2.0
    assert run["val_losses"][-1][0] == run["settings"]["steps"]


def test_random_letters_are_not_words_of_the_corpus():
    assert word_overlap("xqzt bvkw jjfp qqrr zzxv") == 0.0
    assert "king" in corpus_words()
