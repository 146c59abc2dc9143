"""The grader wherever Python lives (issue 57): what a sandbox is shown of the interpreter.

The plan and the refusals run as any user (``reach`` only reads). The real thing — the course
and a virtual environment in a folder under ``/tmp`` below a 0700 one, graded with submissions and an
answer key beside them under the same ``/tmp`` — needs sandboxes (root on Linux): skipped
elsewhere with the reason, required in CI (``COURSE_REQUIRE_SANDBOX=1``).
"""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import time

import pytest

import tools.classroom.reach as reach
from tools.classroom.sandbox import why_not

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the other interpreters here (``.ci/other-pythons`` sets it): each one's venv is planned too
PYTHONS = [sys.executable, *filter(None, os.environ.get("COURSE_PYTHONS", "").split(os.pathsep))]
REASON = why_not()
needs_sandbox = pytest.mark.skipif(REASON is not None, reason=f"no sandbox here: {REASON}")


def _venv(where) -> str:
    """A venv at ``where`` (no pip: a second), seeing this environment's packages through a .pth
    file; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = os.path.join(where, "bin", "python")
    own = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(own, "course-deps.pth"), "w") as f:   # (also what .pth files added)
        f.write("\n".join(p for p in dict.fromkeys([*site.getsitepackages(), *sys.path])
                          if p and os.path.isdir(p)) + "\n")
    return python


def test_the_running_interpreter_needs_its_prefixes_and_where_torch_lives():
    import torch
    paths = reach.interpreter_paths()
    for needed in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(torch.__file__))):
        assert os.path.realpath(needed) in paths or os.path.abspath(needed) in paths, needed
    targets = reach.plan([ROOT]).targets
    assert any(reach._inside(os.path.realpath(sys.executable), t) for t in targets)
    assert all(not reach._inside(a, b) for a in targets for b in targets if a != b)


@pytest.mark.parametrize("python", PYTHONS)
def test_a_venv_of_each_python_here_is_planned_whole(tmp_path, python):
    subprocess.run([python, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    venv_python = str(tmp_path / "venv" / "bin" / "python")
    base = subprocess.run([venv_python, "-I", "-c", "import sys, sysconfig; print(sys.base_prefix);"
                           " print(sysconfig.get_path('stdlib')); print(sysconfig.get_path("
                           "'purelib'))"], check=True, capture_output=True, text=True).stdout
    needed = [str(tmp_path / "venv"), *base.split()]
    targets = reach.plan([ROOT], executable=venv_python).targets
    for path in needed:
        assert any(reach._inside(os.path.realpath(path), t) or reach._inside(path, t)
                   for t in targets), (path, targets)
    assert reach.why_unreachable([ROOT], executable=venv_python) is None


def test_a_closed_folder_above_is_covered_once_and_nothing_inside_a_target_is_bound_twice(
        tmp_path, monkeypatch):
    closed, env = tmp_path / "home", tmp_path / "home" / "teacher" / "venv"
    (env / "lib" / "site-packages").mkdir(parents=True)
    (tmp_path / "opt").mkdir()
    monkeypatch.setattr(reach, "PRIVATE", ())   # here all lives under /tmp: judge it as a disk
    monkeypatch.setattr(reach, "_mode", lambda p: 0o40700 if reach._inside(p, str(closed)) or
                        p in (str(env), str(env / "lib")) else 0o40755)   # (tmp_path is closed)
    monkeypatch.setattr(reach, "interpreter_paths", lambda executable=None: (
        str(env), str(env / "lib" / "site-packages"), str(tmp_path / "opt")))
    got = reach.plan([str(closed / "teacher")])
    assert got.targets == (str(tmp_path / "opt"), str(closed / "teacher"))
    assert got.covers == (str(closed),)


def test_an_environment_others_cannot_read_is_refused_in_one_line_naming_the_path_and_fix(tmp_path):
    python = _venv(tmp_path / "venv")
    assert reach.why_unreachable([ROOT], executable=python) is None
    packages = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    os.chmod(os.path.join(packages, "course-deps.pth"), 0o600)
    reach.interpreter_paths.cache_clear()
    line = reach.why_unreachable([ROOT], executable=python)
    assert line is not None and "\n" not in line
    assert f"{packages}/course-deps.pth cannot be read by other users" in line
    assert f"chmod -R o+rX {tmp_path / 'venv'}" in line


def test_an_environment_inside_the_submissions_or_one_that_shows_all_of_tmp_is_refused(
        tmp_path, monkeypatch):
    python = _venv(tmp_path / "in" / "venv")
    line = reach.why_unreachable([ROOT], hide=[str(tmp_path / "in")], executable=python)
    assert f"lies inside {tmp_path / 'in'}" in line and "\n" not in line
    monkeypatch.setattr(reach, "interpreter_paths", lambda executable=None: ("/tmp",))
    assert "everything in /tmp" in reach.why_unreachable([ROOT])


def test_the_grader_refuses_before_grading_anything(tmp_path, monkeypatch, capsys):
    import tools.classroom.grade as grade
    from tools.classroom.__main__ import main
    monkeypatch.setattr(grade, "why_not", lambda: None)   # as if sandboxes could be made
    monkeypatch.setattr(grade, "why_unreachable", lambda **kw: "simulated: /x cannot be read")
    monkeypatch.setattr(grade, "grade_notebook", lambda *a, **k: pytest.fail("graded"))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.ipynb").write_text(json.dumps({"cells": []}))
    assert main(["grade", str(tmp_path / "in"), str(tmp_path / "book")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "simulated: /x cannot be read" in err
    assert not (tmp_path / "book").exists()


# what a snooping submission may see under /tmp: its answer is 42 only if it saw nothing else
SNOOP = """import os, sys
bad = [p for p in ({hidden!r}) if os.path.exists(p)]
bad += [n for n in os.listdir({tmp!r}) if n not in ('course', 'venv')]
bad += [n for n in os.listdir(os.path.dirname({tmp!r})) if n != os.path.basename({tmp!r})]
try:
    open(os.path.join({venv!r}, 'pwned'), 'w')
    bad.append('wrote into the venv')
except OSError:
    pass
print(bad)
answer = 42 if not bad and sys.prefix == {venv!r} else 0"""


@needs_sandbox
def test_the_course_in_a_venv_under_a_closed_folder_in_tmp_grades_and_shows_nothing_else(
        tmp_path):
    # pytest's folder above tmp_path, /tmp/pytest-of-<user>, is closed (0700)
    from tests.classroom.test_hostile import CHAPTER, DOUBLE
    from tools.classroom.edition import answered_notebook
    started = time.monotonic()
    assert not os.stat(tmp_path.parent.parent).st_mode & 0o001
    tmp_path.chmod(0o755)   # open: only the sandbox's binds keep the submissions out of sight
    course, venv = tmp_path / "course", tmp_path / "venv"
    python = _venv(venv)
    for part in ("course_lib", "tools", "tests"):
        shutil.copytree(os.path.join(ROOT, part), course / part,
                        ignore=shutil.ignore_patterns("__pycache__", ".hostile_probe"))
    made = time.monotonic() - started
    chapter, folder, book, key = (tmp_path / "98_hostile.ipynb", tmp_path / "in",
                                  tmp_path / "book", tmp_path / "answer_key.txt")
    chapter.write_text(json.dumps(CHAPTER))
    folder.mkdir()
    key.write_text("the teacher's key")
    key.chmod(0o600)
    snoop = SNOOP.format(hidden=(str(folder), str(key), str(book), str(chapter)),
                         tmp=str(tmp_path), venv=str(venv))
    for name, answers in {"honest": {0: "answer = 42", 1: DOUBLE},
                          "snoop": {0: snoop, 1: DOUBLE}}.items():
        (folder / f"{name}.ipynb").write_text(json.dumps(answered_notebook(CHAPTER, answers)))
    code = ("import json\nfrom pathlib import Path\nfrom tools.classroom.grade import grade_folder\n"
            f"rs = grade_folder(Path({str(folder)!r}), time_limit=20, chapters=[Path({str(chapter)!r})], "
            f"hide=({str(book)!r},))\n"
            "print(json.dumps({r.file.rsplit('/', 1)[1]: [[e.passed, e.feedback] for e in "
            "r.exercises] + [r.error] for r in rs}))")
    done = subprocess.run([python, "-c", code], cwd=course, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(course)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    print(f"venv and course copy made in {made:.1f} s; graded in "
          f"{time.monotonic() - started - made:.0f} s: {got}")
    assert [v[0] for v in got["honest.ipynb"][:2]] == [True, True], got
    assert [v[0] for v in got["snoop.ipynb"][:2]] == [True, True], got   # it saw nothing else
    assert not (venv / "pwned").exists()
