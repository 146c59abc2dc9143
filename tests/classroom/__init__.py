"""Tests of the classroom tool (``tools/classroom``). ``python -m tests.classroom`` is the old
command: it warns and forwards to ``python -m tools.classroom`` (kept one release)."""
