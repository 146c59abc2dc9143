"""The grader's kernel contains a submission: time limit, output cap, a death, its own folder."""
import os

import pytest

from tools.classroom.session import Session


@pytest.fixture(scope="module")
def session():
    with Session(output_cap=10_000, grace=10.0) as s:
        yield s


def test_a_hang_is_interrupted_at_the_time_limit_and_the_kernel_goes_on(session):
    got = session.run("import time\nwhile True:\n    time.sleep(0.1)", time_limit=2)
    assert got.limit == "time" and not got.ok
    assert session.alive
    after = session.run("x = 6 * 7", time_limit=30, expressions={"v": "x"})
    assert after.ok and after.expressions["v"]["data"]["text/plain"] == "42"


def test_a_flood_of_output_is_stopped_at_the_cap(session):
    got = session.run("while True:\n    print('x' * 1000)", time_limit=60)
    assert got.limit == "output" and len(got.output) <= 10_000
    assert session.alive


def test_the_kernel_works_in_its_own_folder_and_deleting_it_harms_nothing_else(session):
    got = session.run("import os, shutil\nwhere = (os.getcwd(), os.environ['HOME'])\n"
                      "shutil.rmtree(os.getcwd())", time_limit=30, expressions={"v": "where"})
    assert got.ok, got.error
    assert repr((session.folder, session.folder)) == got.expressions["v"]["data"]["text/plain"]
    assert os.path.isdir(session.private)  # the kernel's sockets live elsewhere
    session.reset_folder()
    assert os.path.isdir(session.folder)


def test_a_kernel_that_exits_is_reported_and_restarted(session):
    got = session.run("import os\nos._exit(3)", time_limit=30)
    assert got.limit == "died" and not session.alive
    session.restart()
    assert session.run("1 + 1", time_limit=30).ok and os.path.isdir(session.folder)


def test_closing_removes_both_folders():
    s = Session()
    folders = (s.folder, s.private)
    s.close()
    assert not any(os.path.exists(f) for f in folders)


def test_code_that_ignores_the_interrupt_is_killed_after_the_grace():
    with Session(grace=1.0) as s:
        got = s.run("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "time.sleep(600)", time_limit=1)
        assert got.limit == "time" and got.error.startswith("killed") and not s.alive
