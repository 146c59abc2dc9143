"""Deprecated (issue 51): :mod:`course_lib.deepspeed.holdings` (``census`` is chapter 01's, in
:mod:`course_lib.memory.census`); this module's ``census`` is ``holdings``.

Every public name is served from its new home with a ``DeprecationWarning``; the shim goes in
the next release.
"""
from __future__ import annotations

from course_lib.common.deprecation import renamed

_NEW = "course_lib.deepspeed.holdings"
__getattr__ = renamed(__name__, {"census": f"{_NEW}.holdings", **{
    name: f"{_NEW}.{name}" for name in ("CATEGORIES", "predict_deepspeed", "deepspeed_estimate",
                                        "largest_layer", "flat_alignment", "split_key_bias")}})
