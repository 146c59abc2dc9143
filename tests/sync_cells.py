"""Deprecated: ``tests/sync_cells.py`` moved to ``tools/sync_cells.py``; ``python -m tests.sync_cells``
warns and forwards to ``python -m tools.sync_cells`` (kept one release)."""
import sys
import warnings

from tools.sync_cells import *  # noqa: F401,F403
from tools.sync_cells import main

warnings.warn("tests.sync_cells is deprecated: use python -m tools.sync_cells",
              DeprecationWarning, stacklevel=1 if __name__ == "__main__" else 2)

if __name__ == "__main__":
    sys.exit(main())
