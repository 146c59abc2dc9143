"""The commit protocol of chapter 6 in five short functions: the notebook cells' library copy.

``06_fault_tolerance`` types these in ``library_copy`` cells;
:func:`course_lib.fault_tolerance.checkpoint.save_checkpoint` and ``load_checkpoint`` build on
them (adding RNG states, checksums, a ``latest`` pointer, pruning). :func:`save_sharded` /
:func:`load_committed`: DCP with ``get_state_dict`` / ``set_state_dict``, each rank writing and
reading only its own shards, any world size loading any checkpoint; loading refuses a directory
without the commit marker and reads through :mod:`course_lib.fault_tolerance.checkpoint_safe`.
:func:`save_committed`: every rank writes into ``step_N.tmp``; a barrier; then rank 0
:func:`publish` es: the marker last (temp file, fsync, rename), then one atomic rename to
``step_N``; a crash before leaves a ``.tmp`` without a marker. :func:`latest_committed`: the
highest ``step_N`` that carries the marker.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


__all__ = ["MARKER", "save_sharded", "load_committed", "publish", "save_committed",
           "latest_committed", "write_atomic", "fsync_dir"]

MARKER = "manifest.json"  # the commit marker: its presence says "every shard is on disk"


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file inside ``path`` durable (survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    try:  # Linux shows it without changing it (os.umask can only set it)
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        return 0o022


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    The temporary file gets a fresh random name, created with ``O_EXCL | O_NOFOLLOW``
    (``tempfile.mkstemp``): a file or symlink planted under a predictable name such as
    ``latest.tmp`` is never opened, and ``os.replace`` swaps the name ``path`` itself (a symlink
    there is replaced, not followed)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # what open(path, "w") gives: mkstemp makes it 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def save_sharded(path, model, optimizer):
    """Collective: each rank writes only its own shards of the model and of Adam's states."""
    model_sd, optim_sd = get_state_dict(model, optimizer)   # DTensor shards, full names
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))


def load_committed(path, model, optimizer):
    """Collective: refuse an unfinished save, else read this rank's slices (any world size).

    For checkpoints you wrote: DCP's reader unpickles ``.metadata`` (``load_checkpoint`` reads
    an untrusted folder safely)."""
    if not (Path(path) / MARKER).is_file():
        raise FileNotFoundError(f"{Path(path).name} has no commit marker: an unfinished save")
    model_sd, optim_sd = get_state_dict(model, optimizer)   # the shards to fill, in place
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def publish(tmp, final, marker):
    """Rank 0, once every rank has written into ``tmp``: the marker last, then one rename."""
    write_atomic(Path(tmp) / MARKER, marker)   # temp file, fsync, os.replace
    os.rename(tmp, final)                      # readers see the whole directory or nothing
    fsync_dir(Path(final).parent)              # ... and so does the disk after a power cut


def save_committed(root, step, model, optimizer, before_commit=None):
    """Collective: shards into ``step_N.tmp``; once every rank is done, rank 0 publishes."""
    tmp, final = Path(root) / f"step_{step:06d}.tmp", Path(root) / f"step_{step:06d}"
    save_sharded(tmp, model, optimizer)        # every rank, in parallel
    if before_commit is not None:
        before_commit()                        # fault injection: a rank dies right here
    dist.barrier()                             # every rank has written and is still alive
    if dist.get_rank() == 0:
        publish(tmp, final, json.dumps({"step": step}))
    dist.barrier()                             # nobody trains on before the commit
    return final


def latest_committed(root):
    """The ``step_N`` directory with the highest N that carries the commit marker, or None."""
    steps = [int(p.name[5:]) for p in Path(root).glob("step_*")
             if p.name[5:].isdigit() and (p / MARKER).is_file()]
    return Path(root) / f"step_{max(steps):06d}" if steps else None
