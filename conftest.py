"""Plugins for the whole run: per-notebook nbval times, exercise checks tested both ways."""
pytest_plugins = ["tests.nbval_times", "tests.nbval_exercises"]
