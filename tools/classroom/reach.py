"""What a sandbox must see of the grader's Python, wherever it lives, and nothing more (issue 57).

Each sandbox (:mod:`tools.classroom.sandbox`) mounts a private ``/tmp`` and ``/dev/shm`` and runs
as a uid of its own, so an interpreter installed under ``/tmp`` (a venv in a container), or
below a folder other users cannot enter (``/root/.pyenv``, a teacher's 0700 home, a conda
prefix there), would be gone or closed inside it. :func:`plan` lists the folders the
interpreter needs — its prefixes (``sys.prefix``, ``sys.base_prefix``, the exec prefixes), the
folder of its executable and of the file that link points to, every folder on its ``sys.path``
(site-packages and what ``.pth`` files add) and the folders an editable install maps (setuptools'
``__editable__`` finders) — plus the course's own folder. The sandbox binds each of them,
read-only, at its own path, and covers a closed folder above one (``/root``) with an empty
tmpfs first: only those folders appear, not their neighbours (another student's work or the
teacher's files under the same ``/tmp``). :func:`why_unreachable` says, in one line naming the
path and the fix, where that cannot work: a needed folder the sandbox's uid cannot read (the
permissions travel with a bind mount), one inside a hidden folder (the submissions), or one that
would expose the whole ``/tmp``. The grader asks it before grading anything.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

#: Mounted afresh (empty) in each sandbox: what lives below them must be bound back.
PRIVATE = ("/tmp", "/dev/shm")

# run by the interpreter itself (-E -s: as in the sandbox, no PYTHON* variables, no user site)
_PROBE = """\
import json, sys
paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]
for name, module in list(sys.modules.items()):
    if name.startswith("__editable__"):
        paths += [str(p) for p in getattr(module, "MAPPING", {}).values()]
        paths += [str(p) for ps in getattr(module, "NAMESPACES", {}).values() for p in ps]
print(json.dumps(paths))
"""


@dataclass(frozen=True)
class Plan:
    """``targets``: paths bound read-only at their own place, outermost first (none inside
    another); ``covers``: closed folders outside ``PRIVATE`` covered by an empty tmpfs first."""

    targets: tuple[str, ...]
    covers: tuple[str, ...]


@lru_cache(maxsize=4)
def interpreter_paths(executable: str = sys.executable) -> tuple[str, ...]:
    """Every existing path ``executable`` needs (absolute, and each symlink's target too)."""
    with tempfile.TemporaryDirectory(prefix="course-probe-") as home:
        done = subprocess.run([executable, "-E", "-s", "-c", _PROBE], cwd=home, timeout=60,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home},
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{executable} could not report its paths: {done.stderr.strip()}")
    named = [p for p in json.loads(done.stdout) if p] + [os.path.dirname(executable)]
    found: list[str] = []
    for path in (*named, os.path.dirname(os.path.realpath(executable))):
        for p in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.exists(p) and p not in found:
                found.append(p)
    return tuple(found)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _mode(path: str) -> int:
    return os.stat(path).st_mode


def _closed_above(path: str) -> str | None:
    """The outermost folder above ``path`` that other users cannot enter; None also for a path
    under PRIVATE (the folders above it are made afresh, open, in the sandbox's tmpfs)."""
    if any(_inside(path, p) for p in PRIVATE):
        return None
    parts = Path(path).parts
    for i in range(2, len(parts)):
        folder = str(Path(*parts[:i]))
        if not _mode(folder) & stat.S_IXOTH:
            return folder
    return None


def plan(readonly: Sequence[str] = (), executable: str = sys.executable) -> Plan:
    """The binds and covers that make ``executable``'s environment and ``readonly`` reachable."""
    wanted = sorted({os.path.abspath(p) for p in (*interpreter_paths(executable), *readonly)
                     if os.path.exists(p)}, key=lambda p: (p.count("/"), p))
    targets: list[str] = []
    for path in wanted:
        if not any(_inside(path, t) for t in targets):
            targets.append(path)
    covers: list[str] = []
    for closed in filter(None, map(_closed_above, targets)):
        if not any(_inside(closed, c) for c in covers):
            covers = [c for c in covers if not _inside(c, closed)] + [closed]
    return Plan(tuple(targets), tuple(covers))


def _closed(path: str) -> bool:
    """Whether another user cannot read ``path`` (or enter it, a folder); a link is judged by
    what it points to, elsewhere."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return False
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need != need


def _unreadable(path: str, target: str) -> str | None:
    """The first folder from ``target`` down to ``path``, ``path`` itself or an entry directly in
    it that another user cannot read (or enter), if any."""
    parts = Path(path).relative_to(target).parts
    for i in range(len(parts) + 1):
        here = os.path.join(target, *parts[:i])
        if _closed(here):
            return here
    if os.path.isdir(path) and not os.path.islink(path):
        with os.scandir(path) as entries:
            for entry in entries:
                if _closed(entry.path):
                    return entry.path
    return None


def why_unreachable(readonly: Sequence[str] = (), hide: Sequence[str] = (),
                    executable: str = sys.executable) -> str | None:
    """One line naming the path and the fix where ``executable``'s environment (or ``readonly``)
    cannot be made reachable, read-only, in a sandbox; None where it can."""
    try:
        needed = plan(readonly, executable)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as err:
        return f"cannot tell which folders the interpreter {executable} needs: {err}"
    hidden = [os.path.abspath(h) for h in hide]
    fix = "install the course's environment where other users can read it"
    paths = {os.path.abspath(p) for p in (*interpreter_paths(executable), *readonly)}
    for target in needed.targets:
        if target == "/" or any(_inside(p, target) for p in PRIVATE):
            return (f"the interpreter needs {target}, and showing it in a sandbox would show "
                    f"everything in {' and '.join(PRIVATE)} (other students' work among it): take "
                    f"it off the interpreter's path (PYTHONPATH, a .pth file) or move what it "
                    f"holds into a folder of its own")
        inside = next((h for h in hidden if _inside(target, h)), None)
        if inside:
            return (f"the interpreter needs {target}, which lies inside {inside}, a folder the "
                    f"submissions must not see: move the submissions (or the gradebook) or the "
                    f"environment so that neither holds the other")
        closed = next(filter(None, (_unreadable(p, target) for p in sorted(paths)
                                    if _inside(p, target))), None)
        if closed:
            return (f"{closed} cannot be read by other users, and each submission runs as one "
                    f"(its permissions stay the same in the sandbox): chmod -R o+rX {target}, "
                    f"or {fix}")
    for file in {executable, os.path.realpath(executable)}:
        if not os.stat(file).st_mode & stat.S_IXOTH:
            return (f"{file} cannot be run by other users, and each submission runs as one: "
                    f"chmod o+rx {file}, or {fix}")
    return None
