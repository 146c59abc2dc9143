"""The course's tools outside the package: ``python -m tools.classroom`` (the student edition and
the sandboxed grader) and ``python -m tools.sync_cells`` (the library's definitions written into
the notebooks' cells). Run from the repository root; not installed with ``course_lib``."""
