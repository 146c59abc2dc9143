"""Deprecated old path (issue 51): the capstone's predictions live in
:mod:`course_lib.composition.predict`, beside the layout's bytes, so that the layout, once
parsed, flows down into its predictions without climbing back up to the capstone."""
from __future__ import annotations

from course_lib.common.deprecation import renamed

__getattr__ = renamed(__name__, {**{name: f"course_lib.composition.predict.{name}" for name in (
    "predict_rank", "rank_prediction", "rank_work", "step_time", "slowest", "slowest_step",
    "predict_peak", "root_bytes", "comm_per_step", "collective_seconds", "predict_step_time",
    "ddp_buckets")}, **{f"DDP_{n}BUCKET_BYTES": f"course_lib.data_parallel.buckets.DDP_{n}"
                        "BUCKET_BYTES" for n in ("", "FIRST_")}})
