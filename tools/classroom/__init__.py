"""Teaching tools outside the package: the student edition and the autograder.

    python -m tools.classroom student OUT_DIR [notebook.ipynb ...]
    python -m tools.classroom grade SUBMISSIONS_DIR OUT_DIR [--time-limit S] [--output-cap BYTES]

``edition`` writes the chapters without their Solution blocks; ``grade`` runs each submitted
exercise's check in a fresh kernel after the *original* notebook's cells (``session`` contains
what a submission does) and ``gradebook`` writes the CSV and the HTML feedback. Exercises are
found by ``tests/exercise_cells.py``, the same code that tests them under nbval. See
docs/teaching.md.
"""
