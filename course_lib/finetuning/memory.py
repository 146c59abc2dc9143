"""Deprecated (issue 51): :mod:`course_lib.finetuning.footprint`, renamed apart from ``course_lib.memory``.

Every public name is served from its new home with a ``DeprecationWarning``; the shim goes in
the next release.
"""
from __future__ import annotations

from course_lib.common.deprecation import renamed

_NEW = "course_lib.finetuning.footprint"
__getattr__ = renamed(__name__, {name: f"{_NEW}.{name}" for name in
                                 ("METHODS", "build_finetune_model", "measure_finetune",
                                  "measure_module")})
