"""Worker scripts that run unchanged under ``torchrun`` (``-m course_lib.scripts.NAME``),
under :func:`course_lib.run` (call their ``main``), or as a single plain process."""
