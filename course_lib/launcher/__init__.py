"""The launcher (chapter 00): how a cell's function becomes N real processes — :func:`course_lib.run`,
real torchrun, devices per rank, the live progress line. Modules starting with ``_`` are its
private mechanics (fork server, worker, rank pipes, reaper)."""
