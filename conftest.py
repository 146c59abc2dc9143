"""Plugins for the whole run: per-notebook nbval times, exercise checks tested both ways, and
CI's conditions (the clock tests under load, the notebooks on one core; off unless asked for)."""
pytest_plugins = ["tests.nbval_times", "tests.nbval_exercises", "tests.under_load",
                  "tests.one_core"]
