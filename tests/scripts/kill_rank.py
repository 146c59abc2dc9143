"""Run a script, SIGKILLing one rank of its first attempt just before a given optimizer step.

``COURSE_KILL_AT=RANK:STEP python tests/scripts/kill_rank.py SCRIPT ARGS...`` (as torchrun's
target, or alone: rank 0) runs SCRIPT as ``__main__``; in attempt 0
(``TORCHELASTIC_RESTART_COUNT``) the process of rank RANK kills itself, with no chance to clean
up, when its optimizer is about to take step STEP (counted from 0 in this process). A global
optimizer hook: the script itself is not changed.
"""
import os
import runpy
import signal
import sys

from torch.optim.optimizer import register_optimizer_step_pre_hook

KILL_ENV = "COURSE_KILL_AT"

rank, step = map(int, os.environ[KILL_ENV].split(":"))
if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and int(os.environ.get("RANK", 0)) == rank:
    taken = [0]

    def hook(optimizer, args, kwargs):
        if taken[0] == step:
            os.kill(os.getpid(), signal.SIGKILL)
        taken[0] += 1
    register_optimizer_step_pre_hook(hook)

script = os.path.abspath(sys.argv[1])
sys.argv = [script, *sys.argv[2:]]
sys.path.insert(0, os.path.dirname(script))
runpy.run_path(script, run_name="__main__")
