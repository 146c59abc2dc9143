"""A link sweep kept on disk, and the verdicts a learner checks (chapter 5).

Where namespaces cannot be made (no root, unprivileged user namespaces switched off, macOS,
Binder), chapter 5 shows ``data/link_sweep.json`` instead — clearly labelled as recorded on
another machine, with that machine, the date and the command that reproduces it::

    sudo python benchmarks/record_link_sweep.py --out data/link_sweep.json

(``sudo`` is not needed where ``unshare --user --map-root-user --net`` works.) The file is
plain JSON, read with :func:`json.load` and checked field by field: nothing in it can run code.
:func:`verdicts` turns rows — live or recorded — into true/false statements with stated
tolerances, so the notebook's checked output does not depend on the machine.
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Sequence

from course_lib.common.deprecation import moved_to_benchmark
from course_lib.communication.link_sweep import (STEP_FACTOR, LinkRow, LinkSweepUnavailable,
                                                 link_sweep)

__all__ = ["RECORDED_PATH", "RECORD_RATES", "Recorded", "load_recorded",
           "live_or_recorded", "verdicts", "BYTES_TOLERANCE"]

RECORDED_PATH = Path(__file__).resolve().parents[2] / "data" / "link_sweep.json"
#: What the stored sweep measured: unthrottled, 1 Gbit/s, 100 Mbit/s.
RECORD_RATES = (0, 1000, 100)
#: Largest relative difference allowed between measured and predicted bytes (and byte ratios).
BYTES_TOLERANCE = 0.10


class Recorded(list):
    """Rows loaded from disk, with ``meta`` (machine, date, command) and a ``label``."""

    meta: dict
    label: str


def load_recorded(path: str | Path = RECORDED_PATH) -> Recorded:
    """The stored rows (a list of :class:`LinkRow`) with ``.meta`` and ``.label``."""
    data = json.loads(Path(path).read_text())
    names = {f.name: f.type for f in fields(LinkRow)}
    out = Recorded()
    for item in data["rows"]:
        if set(item) != set(names):
            raise ValueError(f"{path}: a row has fields {sorted(item)}, expected {sorted(names)}")
        out.append(LinkRow(**item))
    meta = data["meta"]
    out.meta = meta
    out.label = (f"RECORDED on another machine ({meta['cpu']}, {meta['cores']} cores, torch "
                 f"{meta['torch']}, {meta['date']}), not measured here; reproduce with: "
                 f"{meta['command']}")
    return out


def live_or_recorded(rates: Sequence[float] = RECORD_RATES, **kwargs) -> tuple[list[LinkRow], str]:
    """``(rows, source)``: the live sweep where namespaces work, else the stored one, labelled."""
    try:
        rows = link_sweep(rates, **kwargs)
    except LinkSweepUnavailable as exc:
        rows = load_recorded()
        return rows, f"{exc.reason}.\n{rows.label}"
    return rows, "measured live, on this machine, just now"


def _by(rows: Sequence[LinkRow], strategy: str) -> list[LinkRow]:
    """The strategy's rows from the fastest link to the slowest (0 = unthrottled first)."""
    mine = [r for r in rows if r.strategy == strategy and not r.latency_ms]
    return sorted(mine, key=lambda r: -r.rate_mbit if r.rate_mbit else float("-inf"))


def verdicts(rows: Sequence[LinkRow]) -> dict[str, bool]:
    """Statements about ``rows`` with stated tolerances, each True or False.

    * the step slows as the link slows: on the slowest link at least the unthrottled step plus
      half the predicted transfer time (overlap may hide some of it, not more than half);
    * bytes: each row's measured bytes within :data:`BYTES_TOLERANCE` of the prediction, and
      FSDP's bytes / DDP's bytes within it of the predicted ratio (2 on gloo, 1.5 on NCCL);
    * time: each throttled step within :data:`STEP_FACTOR` of its α-β prediction.
    """
    out = {}
    lo, hi = STEP_FACTOR
    strategies = sorted({r.strategy for r in rows})
    for s in strategies:
        chain = _by(rows, s)
        if len(chain) >= 2:
            slow = chain[-1]
            out[f"{s}: the slowest link stretches the step (>= base + half the transfer)"] = (
                slow.step_s >= chain[0].step_s + 0.5 * (slow.predicted_s - slow.base_s))
    out["bytes on the wire within 10 % of the prediction, every row"] = all(
        abs(r.sent_bytes / r.predicted_bytes - 1) <= BYTES_TOLERANCE for r in rows)
    pairs = [(d, f) for d in rows for f in rows if d.strategy == "ddp" and f.strategy == "fsdp"
             and (d.rate_mbit, d.latency_ms) == (f.rate_mbit, f.latency_ms)]
    if pairs:
        out["FSDP/DDP bytes within 10 % of the predicted ratio"] = all(
            abs((f.sent_bytes / d.sent_bytes) / (f.predicted_bytes / d.predicted_bytes) - 1)
            <= BYTES_TOLERANCE for d, f in pairs)
    throttled = [r for r in rows if r.rate_mbit or r.latency_ms]
    if throttled:
        out[f"every throttled step within a factor {hi:g} of its α-β prediction"] = all(
            lo <= r.ratio <= hi for r in throttled)
    return out


__getattr__ = moved_to_benchmark(__name__, ("record", "main"), "record_link_sweep.py")  # issue 51
