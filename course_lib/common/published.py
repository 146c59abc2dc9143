"""The scale a laptop cannot show: published GPU figures and an optional GPU run (chapters 02, 04, 05, 09).

``data/published_speed.json`` holds figures copied from their sources (torchtitan's
``docs/performance.md`` tables, the Megatron-LM and Zero Bubble papers), each with the table or
section and URL it came from; :func:`show_published` prints a chapter's, labelled "published,
not measured here". ``data/gpu_reference.json`` is written by ``benchmarks/gpu_reference.py``
on a machine with GPUs; when it is present :func:`show_published` adds its rows with the GPU,
date and versions, and when it is absent it prints nothing for it. Both files are plain JSON
(``json.load``: nothing in them runs code); an entry without the fields read here is refused.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PUBLISHED_PATH", "GPU_REFERENCE_PATH", "published", "gpu_reference", "format_published",
           "show_published"]

_DATA = Path(__file__).resolve().parents[2] / "data"
PUBLISHED_PATH = _DATA / "published_speed.json"
GPU_REFERENCE_PATH = _DATA / "gpu_reference.json"
_ENTRY = ("id", "chapters", "what", "rows", "columns", "source", "url")
_META = ("gpu", "date", "torch", "nccl")


def published(chapter: str, path: Path | str = PUBLISHED_PATH) -> list[dict]:
    """The entries of ``path`` for ``chapter`` ("02", "04", ...), in file order."""
    data = json.loads(Path(path).read_text())
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected an object with a list 'entries'")
    for e in entries:
        if missing := [k for k in _ENTRY if not isinstance(e, dict) or k not in e]:
            raise ValueError(f"{path}: an entry lacks {missing}")
    return [e for e in entries if chapter in e["chapters"]]


def gpu_reference(experiment: str, path: Path | str = GPU_REFERENCE_PATH) -> dict | None:
    """``{"meta": {...}, "result": {...}}`` of one experiment of the GPU run, or None without the file."""
    path = Path(path)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    meta = data.get("meta") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or any(k not in meta for k in _META):
        raise ValueError(f"{path}: 'meta' must name {list(_META)}")
    results = data.get("experiments", {})
    if not isinstance(results, dict):
        raise ValueError(f"{path}: 'experiments' must be an object")
    return None if experiment not in results else {"meta": meta, "result": results[experiment]}


def _table(columns: list, rows: list) -> list[str]:
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    return ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in [columns, *rows]]


def format_published(chapter: str, path: Path | str = PUBLISHED_PATH) -> str:
    lines = ["Published, not measured here:"]
    for e in published(chapter, path):
        lines += ["", f"{e['what']}"] + _table(e["columns"], e["rows"])
        lines.append(f"  source: {e['source']} — {e['url']}")
    return "\n".join(lines)


def show_published(chapter: str, experiment: str | None = None,
                   path: Path | str = PUBLISHED_PATH, gpu_path: Path | str = GPU_REFERENCE_PATH) -> None:
    """Print the chapter's published figures; then the GPU run's ``experiment``, if recorded."""
    print(format_published(chapter, path))
    ref = gpu_reference(experiment, gpu_path) if experiment else None
    if ref:
        m = ref["meta"]
        print(f"\nMeasured by benchmarks/gpu_reference.py on {m['gpu']} ({m['date']}, torch "
              f"{m['torch']}, NCCL {m['nccl']}), not on this machine:")
        for line in ref["result"].get("lines", []):
            print(f"  {line}")
