"""What :func:`course_lib.torchrun` raises: a failed job (with its failing rank's traceback), and a
refusal to run where no private network namespace could be made (and why that matters)."""
from __future__ import annotations


class TorchrunError(RuntimeError):
    """torchrun exited with an error; ``rank`` is the failing rank when torchrun named one."""

    def __init__(self, returncode: int, rank: int | None, output: str):
        self.returncode, self.rank, self.output = returncode, rank, output
        lines = output.rstrip().splitlines()
        if rank is not None:
            who = f"rank {rank} failed"
            own = [ln for ln in lines if ln.startswith(f"[rank {rank}] ")]
            # its first Python traceback, whatever gloo logs after it (a peer gone, an abort)
            first = next((k for k, ln in enumerate(own) if "Traceback (most recent call" in ln), None)
            tail = own[first:first + 30] if first is not None else own[-20:]
        else:
            who, tail = "the job failed", lines[-20:]
        text = "\n".join(tail) or "(it printed nothing)"
        super().__init__(f"torchrun exited with code {returncode}: {who}\n"
                         f"--- last lines from {'rank ' + str(rank) if rank is not None else 'the job'}"
                         f" ---\n{text}")


class SharedLoopbackError(RuntimeError):
    """No private network namespace could be made, and the job was not allowed to run without."""


SHARED_LOOPBACK_RISK = ("on the host's loopback every local user can connect to torchrun's stores (they have "
         "no authentication): TCPStore.list_keys() names every key, the rendezvous key "
         "included, and rewriting the pickled state stored there runs code as you in the agent")
