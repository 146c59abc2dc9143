"""The learner's room, ``course_lib/scripts/``: the scripts a learner copies import from the
course only ``tiny`` (the file beside them), ``tiny.py`` only ``course_lib.common``, and a copy
of the folder runs with nothing else of the course importable (``tests/scripts/room.py`` says
exactly what is: the package's ``__init__.py``, ``common/``, ``data/corpus.txt``), alone and
under torchrun on 2 ranks. The copy is a clean checkout (``git clone``), where the README's
torchrun lines run as typed; afterwards ``git status`` is clean (issue 62: nothing a run writes
is tracked; checkpoint.py's default folder, ``outputs/``, is ignored).

Each script joins with ``init_process_group`` itself and ends with its own visible gloo-safe
exit (issue 60): nothing is installed behind its back by ``tiny``.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from course_lib.launcher.script_magic import parse_losses, tolerance_for
from tests.scripts.room import (LEARNER, REPO, ROOM, allowed_course, env_with_path, finish,
                                start_python, start_torchrun)

sys.path.insert(0, str(ROOM.parents[1]))
from course_lib.scripts import MOVED  # noqa: E402

STDLIB = sys.stdlib_module_names


def top_imports(path) -> set[str]:
    """Every module ``path`` imports (anywhere in it)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
    return out


def outside(imports: set[str], allowed: tuple[str, ...]) -> set[str]:
    return {m for m in imports if m.split(".")[0] not in STDLIB and m.split(".")[0] != "torch"
            and m != "__future__" and not any(m == a or m.startswith(a + ".") for a in allowed)}


def test_the_room_holds_the_learners_scripts_tiny_and_the_moved_workers_old_paths_only():
    files = {p.name for p in ROOM.glob("*.py")}
    assert files == {"__init__.py", "tiny.py", *LEARNER, *(f"{m}.py" for m in MOVED)}


@pytest.mark.parametrize("name", LEARNER)
def test_a_learners_script_imports_only_tiny_torch_and_the_standard_library(name):
    assert outside(top_imports(ROOM / name), ("tiny",)) == set()


def test_tiny_imports_only_course_lib_common():
    imports = top_imports(ROOM / "tiny.py")
    assert outside(imports, ("course_lib.common",)) == set()
    assert any(m.startswith("course_lib.common") for m in imports)


def test_the_checker_sees_a_forbidden_import():
    assert outside({"course_lib.launcher.torchrun", "tiny", "os", "torch.distributed"},
                   ("tiny",)) == {"course_lib.launcher.torchrun"}
    assert outside({"course_lib.capstone.data"}, ("course_lib.common",)) == {"course_lib.capstone.data"}


@pytest.mark.parametrize("name", LEARNER)
def test_each_script_joins_and_exits_in_plain_sight(name):
    text = (ROOM / name).read_text()
    assert "dist.init_process_group(" in text
    # the end: destroy, one comment saying why, flush, os._exit(0)
    end = re.search(r"dist\.destroy_process_group\(\)\n(?:.*\n)*?(\s*# .*gloo.*\n(?:\s*# .*\n)*)"
                    r"\s*sys\.stdout\.flush\(\)\n\s*os\._exit\(0\)\n$", text)
    assert end, f"{name} does not end with its visible gloo-safe exit"


def test_tiny_installs_nothing_behind_the_scripts_back():
    text = (ROOM / "tiny.py").read_text()
    assert not re.search(r"atexit|excepthook|os\._exit|exit_without_finalizing", text)


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_a_moved_workers_old_path_serves_its_new_home(old, new):
    text = (ROOM / f"{old}.py").read_text()
    assert top_imports(ROOM / f"{old}.py") == {"course_lib.common.deprecation"}
    assert f'moved_module(globals(), "{new}")' in text
    assert (ROOM.parents[1] / (new.replace(".", "/") + ".py")).is_file()


def test_an_old_worker_path_runs_the_new_one_and_warns(tmp_path):
    done = subprocess.run([sys.executable, "-m", "course_lib.scripts.train_dp", "--steps", "1"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env_with_path(ROOM.parents[1]))
    assert done.returncode == 0, done.stderr
    assert "DeprecationWarning: course_lib.scripts.train_dp is deprecated: use " \
           "course_lib.data_parallel.train_dp" in done.stderr
    assert "-> equal" in done.stdout
    with pytest.warns(DeprecationWarning, match="course_lib.capstone.train_gpt"):
        from course_lib.scripts.train_gpt import parse_args
    from course_lib.capstone.train_gpt import parse_args as new
    assert parse_args is new


README = (REPO / "README.md").read_text()
TORCHRUN_ONLY = {"hello_allreduce.py"}  # written for torchrun alone (chapter 00 runs it so)
README_LINES = re.findall(r"^torchrun --standalone --nproc-per-node=2 course_lib/scripts/\S+\.py$",
                          README, re.M)


@pytest.fixture(scope="module")
def clean_checkout_runs(tmp_path_factory):
    """A clean checkout (``git clone`` of this commit) holds the copy of the room; of the course,
    only what tests/scripts/room.py allows is importable. From the checkout's root: every learner
    script alone (``python course_lib/scripts/NAME.py``; hello_allreduce.py is for torchrun
    only), then the README's torchrun lines and the others' on 2 ranks (chapter 09's 2-D meshes
    are then 1 × 2; tests/composition runs it on 4), each wave's jobs at once (each job is mostly torch's import). Returns the checkout and
    ``{(name, 1 alone or 2 torchrun): (exit code, output)}``."""
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    tmp = tmp_path_factory.mktemp("room")
    clone = tmp / "checkout"
    subprocess.run(["git", "clone", "--quiet", "--depth=1", f"file://{REPO}", str(clone)],
                   check=True, timeout=120)
    env = env_with_path(allowed_course(tmp / "allowed"))
    probe = tmp / "probe.py"  # run as a file from the checkout's root, as the scripts are
    probe.write_text("import importlib.util as u, course_lib\n"
                     "print(course_lib.__file__, u.find_spec('course_lib.launcher'))\n")
    probe = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=env,
                           cwd=clone, timeout=60)
    assert probe.stdout.split() == [str(tmp / "allowed" / "course_lib" / "__init__.py"), "None"]
    alone = {(name, 1): start_python([f"course_lib/scripts/{name}"], clone, env)
             for name in LEARNER if name not in TORCHRUN_ONLY}
    results = {key: finish(proc, 300) for key, proc in alone.items()}
    lines = README_LINES + ["torchrun --standalone --nproc-per-node=2 "
                            f"course_lib/scripts/{name}" for name in LEARNER
                            if f"course_lib/scripts/{name}" not in "\n".join(README_LINES)]
    ranked = {(line.rsplit("/", 1)[1], 2): start_torchrun(line.split(), clone, env) for line in lines}
    results.update({key: finish(proc, 300) for key, proc in ranked.items()})
    return clone, results


def test_the_readme_runs_the_five_strategy_scripts_on_two_ranks():
    assert sorted(line.rsplit("/", 1)[1] for line in README_LINES) == sorted(
        ["ddp.py", "fsdp.py", "tensor_parallel.py", "pipeline.py", "checkpoint.py"])


@pytest.mark.parametrize("name", LEARNER)
def test_a_copy_of_the_room_runs_alone_and_on_two_ranks_with_only_common(clean_checkout_runs, name):
    _, results = clean_checkout_runs
    code2, out2 = results[name, 2]
    assert code2 == 0, f"{name} under torchrun:\n{out2[-3000:]}"
    if name in TORCHRUN_ONLY:  # alone it refuses: tests/launcher/test_torchrun.py
        assert out2.count("of 2: sum of (rank + 1) over all ranks = 3") == 2, out2
        return
    code1, out1 = results[name, 1]
    assert code1 == 0, f"{name} alone:\n{out1[-2000:]}"
    one, two = parse_losses(out1), parse_losses(out2)
    assert len(one) == len(two) >= 8, (out1, out2)  # mesh_2d.py: two runs, 16 steps
    text = (ROOM / name).read_text()
    assert max(abs(a - b) for a, b in zip(one, two)) <= tolerance_for(text), (one, two)


def test_nothing_the_readme_commands_write_is_tracked(clean_checkout_runs):
    clone, _ = clean_checkout_runs
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True,
                            text=True, check=True).stdout
    assert status == "", f"a run left files git would track:\n{status}"
    assert (clone / "outputs" / "checkpoint" / ".metadata").is_file()  # checkpoint.py's default
