"""Chapter 06's answer beside torchft's (chapter 11): the same kind of failure, restart-everything.

:func:`restart_everything` runs chapter 06's resumable loop (:func:`course_lib.fault_tolerance
.training.train`: FSDP2 GPT, a checkpoint every ``every`` steps) on 2 ranks, SIGKILLs rank 1
before step ``kill_at``, which stops the whole job, and launches it again: it resumes from the
newest committed checkpoint. Measured: the step it resumed from (the steps since then are lost
and redone), the failed launch's and the resumed launch's wall time.
"""
from __future__ import annotations

import tempfile
import time

from course_lib.common.checks import positive_int
from course_lib.fault_tolerance.training import Fault, train
from course_lib.launcher.launch import RankError, run


def restart_everything(steps: int = 12, kill_at: int = 7, every: int = 4) -> dict:
    """``lost_steps`` (kill_at - resumed_from), ``resumed_from``, ``failed_s``, ``resumed_s``."""
    steps, kill_at, every = (positive_int(steps, "steps"), positive_int(kill_at, "kill_at"),
                             positive_int(every, "every"))
    if kill_at >= steps:
        raise ValueError(f"kill_at ({kill_at}) must come before the last step ({steps})")
    with tempfile.TemporaryDirectory(prefix="course_restart_") as root:
        start = time.monotonic()
        try:
            run(train, 2, "tiny", steps, ckpt_dir=root, every=every,
                faults=(Fault(0, 1, kill_at),), attempt=0)
            raise RuntimeError("the injected kill did not stop the job")
        except RankError:
            failed = time.monotonic()
        result = run(train, 2, "tiny", steps, ckpt_dir=root, every=every, attempt=1)[0]
        done = time.monotonic()
    return {"resumed_from": result["resumed_from"], "lost_steps": kill_at - result["resumed_from"],
            "failed_s": failed - start, "resumed_s": done - failed, "steps": steps}
