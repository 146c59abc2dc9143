"""``warm_up(wait=False)``: the warm server starts in the background, and the first run uses it."""
import os
import subprocess
import sys

SCRIPT = """
import torch.distributed as dist
from course_lib.launcher import launch

def who():
    return dist.get_rank()

launch.warm_up(wait=False)
print("started before returning:", launch._SERVERS._server is not None)
print("ranks:", launch.run(who, 2))
server = launch._SERVERS._server
launch.warm_up(wait=False)
launch.warm_up()
print("one server:", launch._SERVERS._server is server and server.alive())
"""


def test_warm_up_without_waiting_returns_at_once_and_the_first_run_uses_that_server(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")])), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["started before returning: False", "ranks: [0, 1]",
                                        "one server: True"]
