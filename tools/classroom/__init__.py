"""Teaching tools outside the package: the student edition and the autograder.

    python -m tools.classroom student OUT_DIR [notebook.ipynb ...]
    python -m tools.classroom grade SUBMISSIONS_DIR OUT_DIR [--time-limit S] [--output-cap BYTES]
                                                   [--jobs N]

``edition`` writes the chapters without their Solution blocks; ``grade`` runs each submission's
answers after the *original* notebook's cells in a sandbox (``sandbox``, ``session``), records
what they produce (``replay``) and judges the records with the published checks in a second,
clean sandbox; ``gradebook`` writes the CSV and the HTML feedback. Exercises are
found by ``tests/exercise_cells.py``, the same code that tests them under nbval. See
docs/teaching.md.
"""
