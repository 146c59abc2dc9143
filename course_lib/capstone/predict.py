"""The capstone's predictions, under their old path: they live in
:mod:`course_lib.composition.predict`, beside the layout's bytes, so that the layout, once
parsed, flows down into its predictions without climbing back up to the capstone."""
from __future__ import annotations

from course_lib.composition.predict import (DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES,
                                            collective_seconds, comm_per_step, ddp_buckets,
                                            predict_peak, predict_rank, predict_step_time,
                                            rank_prediction, rank_work, root_bytes, slowest,
                                            slowest_step, step_time)

__all__ = ["predict_rank", "rank_prediction", "rank_work", "step_time", "slowest",
           "slowest_step", "predict_peak", "root_bytes", "comm_per_step", "collective_seconds",
           "predict_step_time", "ddp_buckets", "DDP_BUCKET_BYTES", "DDP_FIRST_BUCKET_BYTES"]
