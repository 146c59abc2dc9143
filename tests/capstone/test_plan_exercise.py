"""Chapter 12's layout exercise: days to train at the chosen row's predicted speed, and the
table printed in label order (choosing is the exercise: not best first)."""
from __future__ import annotations

from types import SimpleNamespace

from course_lib.capstone.exercises import check_training_days
from course_lib.capstone.show import plan_table

ROWS = [SimpleNamespace(label="FSDP 64", fits=False, need_gib=90.0, tokens_per_s_gpu=900.0, mfu=0.5),
        SimpleNamespace(label="FSDP 8 · TP 8", fits=True, need_gib=60.0, tokens_per_s_gpu=600.0, mfu=0.4),
        SimpleNamespace(label="DDP 64", fits=False, need_gib=900.0, tokens_per_s_gpu=1.0, mfu=0.1)]
PLAN = SimpleNamespace(rows=ROWS, gpus=64, global_batch=64, seq_len=8192,
                       model=SimpleNamespace(name="llama-3.1-70b"), cluster=SimpleNamespace(name="H100"))


def test_the_days_follow_the_chosen_row():
    right = 15e12 / (600.0 * 64) / 86400
    assert check_training_days(right, PLAN, "FSDP 8 · TP 8").passed
    assert check_training_days(right * 1.01, PLAN, ROWS[1]).passed
    assert "too high" in check_training_days(right * 1.5, PLAN, "FSDP 8 · TP 8").message
    assert "too low" in check_training_days(right / 64, PLAN, "FSDP 8 · TP 8").message  # per GPU
    assert not check_training_days(right, PLAN, "FSDP 64").passed  # another row, another speed


def test_without_a_choice_the_days_wait_for_it():
    got = check_training_days(3.0, PLAN, ...)
    assert not got.passed and "choose your layout" in got.message


def test_the_table_is_in_label_order():
    lines = plan_table(PLAN).splitlines()
    assert [l.split()[0] for l in lines[2:]] == ["DDP", "FSDP", "FSDP"]
    assert "FSDP 8 · TP 8" in lines[4] and " yes " in lines[4]
