"""Deprecated: ``python -m tests.classroom`` forwards to ``python -m tools.classroom`` (one release)."""
import sys
import warnings

from tools.classroom.__main__ import main

if __name__ == "__main__":
    warnings.warn("python -m tests.classroom is deprecated: use python -m tools.classroom",
                  DeprecationWarning, stacklevel=1)
    sys.exit(main())
