"""What a hostile local user can do to a checkpoint folder (issue 29), for the trust tests.

Each helper edits a *copy* of a good checkpoint as someone with write access to that folder can:
the manifest's sizes and SHA-256 are updated too (they detect accidents; they are no signature).
The edits are bounded: the biggest allocation a broken reader would make is 128 MiB.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import torch

MANIFEST = "manifest.json"


def tamper(ckpt: Path, fname: str, data: bytes) -> None:
    """Replace ``fname`` and update its size and checksum in the manifest, as an attacker can."""
    (ckpt / fname).write_bytes(data)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    manifest["files"][fname] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))


def append(ckpt: Path, fname: str, blob: bytes) -> int:
    """Append ``blob`` to ``fname`` (manifest updated); return the offset where it starts."""
    data = (ckpt / fname).read_bytes()
    tamper(ckpt, fname, data + blob)
    return len(data)


def point_item(ckpt: Path, fqn: str, **fields) -> None:
    """Rewrite the storage record (relative_path, offset, length, ...) of item ``fqn``."""
    metadata = pickle.loads((ckpt / ".metadata").read_bytes())  # our own file: plain pickle
    infos = [info for index, info in metadata.storage_data.items() if index.fqn == fqn]
    assert infos, f"no item {fqn}"
    for info in infos:
        for name, value in fields.items():
            setattr(info, name, value)
    tamper(ckpt, ".metadata", pickle.dumps(metadata))


def set_attribute_first(ckpt: Path, module: str, name: str, attr: str) -> None:
    """Prefix ``.metadata`` with opcodes that set ``module.name.attr = 1`` (GLOBAL, BUILD, POP):
    no code is called, and the rest of the pickle still yields the real metadata."""
    prefix = (b"c" + f"{module}\n{name}\n".encode() + b"N}" + pickle.SHORT_BINUNICODE
              + bytes([len(attr)]) + attr.encode() + b"K\x01s\x86b0")
    tamper(ckpt, ".metadata", prefix + (ckpt / ".metadata").read_bytes())


def torch_bytes(obj) -> bytes:
    """What ``torch.save(obj)`` writes: the format of every DCP record (tensor or bytes item)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def deflated(data: bytes) -> bytes:
    """The same zip archive with every record deflate-compressed (torch's reader accepts it)."""
    src, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename), zipfile.ZIP_DEFLATED)
    return out.getvalue()


def write_manifest(ckpt: Path, edit) -> None:
    """Replace the manifest by ``edit(manifest)`` (a dict, or the text itself if a str)."""
    manifest = json.loads((ckpt / MANIFEST).read_text())
    new = edit(manifest)
    (ckpt / MANIFEST).write_text(new if isinstance(new, str) else json.dumps(new))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def peak_rss_growth(fn) -> int | None:
    """Bytes the resident set grew to at its peak while ``fn()`` ran (exceptions swallowed);
    ``None`` where the peak cannot be reset (``/proc/self/clear_refs``, Linux only)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (the peak) to the current resident size
    except OSError:
        return None
    before = _status_kib("VmRSS")
    try:
        fn()
    except BaseException as exc:  # noqa: B036 - DCP's CheckpointException is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
    return (_status_kib("VmHWM") - before) * 1024


def error_text(exc: BaseException) -> str:
    """Everything a user sees of ``exc``: its message and every chained one."""
    import traceback
    return "".join(traceback.format_exception(exc))


def outside_copy(ckpt: Path, fname: str) -> Path:
    """Move ``fname`` out of the folder and leave a symlink to it (the bytes are unchanged)."""
    target = ckpt.parent / f"elsewhere_{fname.lstrip('.')}"
    os.replace(ckpt / fname, target)
    (ckpt / fname).symlink_to(target)
    return target
