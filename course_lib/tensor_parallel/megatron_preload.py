"""Imported by the warm server, never by a notebook's kernel: megatron-core, quietly, once.

Importing megatron-core costs seconds (it loads torch's inductor through its fused kernels).
Only the ranks of chapter 4's Megatron launch use it, so :mod:`course_lib.tensor_parallel.megatron`
names this module in its rank functions' ``preimport`` attribute: the warm server imports it
before forking them, and every rank starts with megatron-core loaded. A failure is left to the
rank, which imports again and reports it (:func:`~course_lib.tensor_parallel.megatron.megatron_status`).
"""
from __future__ import annotations

import contextlib

from course_lib.tensor_parallel.megatron import _import_megatron

with contextlib.suppress(Exception):
    _import_megatron()
