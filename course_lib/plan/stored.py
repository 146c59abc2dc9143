"""Plans computed once and kept: a table answers at once when it was planned before.

A whole table takes the planner tens of seconds of fake steps; the course's tables (chapters 07
and 12) are stored under ``data/plans/`` as JSON (numbers and names only: nothing read back runs
code), each with the date and the request it answers. :func:`stored_plan` returns the stored
table for a request when there is one, else a plan made earlier in this process, else plans it
(``progress`` called per layout) and keeps it in memory. ``python -m course_lib.plan ... --save
DIR`` writes a table.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

from course_lib.plan.clusters import Cluster, get_cluster
from course_lib.plan.layouts import Candidate
from course_lib.plan.models import MODELS_DIR, STORED, ModelSpec
from course_lib.plan.planner import Plan, PlanRow, plan
from course_lib.plan.predict import StepTime

__all__ = ["PLANS_DIR", "request_key", "plan_to_dict", "plan_from_dict", "save_plan",
           "load_plan", "stored_plan"]

PLANS_DIR = MODELS_DIR.parent / "plans"
_MEMORY: dict[str, Plan] = {}


def request_key(model: str, *, gpus: int, gpus_per_node: int = 8, cluster: str = "h100-80gb",
                memory_gib: float | None = None, global_batch: int | None = None,
                seq_len: int = 8192) -> str:
    """A file name for a request: ``llama-3.1-70b_64gpu_8pn_h100-80gb_79.6gib_b64_s8192``."""
    memory = get_cluster(cluster, gpus_per_node, memory_gib).memory_gib
    batch = gpus if global_batch is None else global_batch
    return (f"{Path(str(model)).name}_{gpus}gpu_{gpus_per_node}pn_{cluster}_{memory:g}gib_b{batch}"
            f"_s{seq_len}")


def plan_to_dict(p: Plan) -> dict:
    """Everything a :class:`Plan` holds, as JSON-ready numbers and strings."""
    return {"model": dataclasses.asdict(p.model), "cluster": dataclasses.asdict(p.cluster),
            "gpus": p.gpus, "global_batch": p.global_batch, "seq_len": p.seq_len,
            "rows": [{"layout": dataclasses.asdict(r.layout), "fits": r.fits,
                      "peak_gib": r.peak_gib, "need_gib": r.need_gib,
                      "tokens_per_s_gpu": r.tokens_per_s_gpu, "mfu": r.mfu,
                      "step": dataclasses.asdict(r.step), "microbatches": r.microbatches}
                     for r in p.rows],
            "assumptions": p.assumptions, "model_flops_per_token": p.model_flops_per_token,
            "seconds": p.seconds, "runs": p.runs}


def plan_from_dict(d: dict) -> Plan:
    rows = [PlanRow(Candidate(**r["layout"]), bool(r["fits"]), float(r["peak_gib"]),
                    float(r["need_gib"]), float(r["tokens_per_s_gpu"]), float(r["mfu"]),
                    StepTime(**r["step"]), int(r["microbatches"])) for r in d["rows"]]
    return Plan(ModelSpec(**d["model"]), Cluster(**d["cluster"]), int(d["gpus"]),
                int(d["global_batch"]), int(d["seq_len"]), rows, dict(d["assumptions"]),
                float(d["model_flops_per_token"]), float(d["seconds"]), int(d["runs"]))


def save_plan(p: Plan, path: str | Path, request: dict) -> Path:
    """Write ``p`` with its ``request`` and today's date to ``path`` (a new file)."""
    path = Path(path)
    data = {"date": time.strftime("%Y-%m-%d"), "request": request, "plan": plan_to_dict(p)}
    with open(path, "x") as f:  # never over a file already there
        json.dump(data, f, indent=1)
        f.write("\n")
    return path


def load_plan(path: str | Path) -> Plan:
    """A plan written by :func:`save_plan` (JSON only), with the date it was computed."""
    data = json.loads(Path(path).read_text())
    return dataclasses.replace(plan_from_dict(data["plan"]), stored=str(data["date"]))


def stored_plan(model: str = "llama-3.1-70b", *, gpus: int = 64, gpus_per_node: int = 8,
                cluster: str = "h100-80gb", memory_gib: float | None = None,
                global_batch: int | None = None, seq_len: int = 8192,
                progress: Callable[[int, int, str], None] | None = None) -> Plan:
    """The table for this request: stored (``data/plans/``), made earlier in this process, or
    planned now (``progress(done, total, label)`` per layout) and kept for the next call."""
    request = dict(gpus=gpus, gpus_per_node=gpus_per_node, cluster=cluster, memory_gib=memory_gib,
                   global_batch=global_batch, seq_len=seq_len)
    if isinstance(model, str) and model in STORED:
        key = request_key(model, **request)
        path = PLANS_DIR / f"{key}.json"
        if key not in _MEMORY and path.is_file():
            _MEMORY[key] = load_plan(path)
    elif isinstance(model, (str, Path)) and Path(model).exists():  # a learner's config.json
        where = Path(model).resolve()
        where = where / "config.json" if where.is_dir() else where
        key = f"{where}:{where.stat().st_mtime_ns}:{sorted(request.items())}"
    else:
        key = None  # a dict or a config object: planned each time
    if key is not None and key in _MEMORY:
        return _MEMORY[key]
    p = plan(model, progress=progress, **request)
    if key is not None:
        _MEMORY[key] = p
    return p
