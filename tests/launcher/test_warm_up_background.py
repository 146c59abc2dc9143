"""``warm_up(wait=False)``: the warm server starts in the background; the first ``run`` waits for it."""
from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import torch.distributed as dist
from course_lib.launcher import launch

launch.warm_up(wait=False)
server = launch._SERVERS.get(wait=False)
assert not server.ready, "warm_up(wait=False) waited for the server"
assert server.alive()

def rank():
    return dist.get_rank(), dist.get_world_size()

assert launch.run(rank, 2) == [(0, 2), (1, 2)]
assert server.ready and launch._SERVERS.get() is server, "the background server was not the one used"
print("background warm-up ok")
"""


def test_warm_up_without_waiting_returns_at_once_and_the_first_run_uses_that_server():
    # a fresh process: this one may already hold a ready server from other tests
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "background warm-up ok" in done.stdout
