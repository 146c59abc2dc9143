"""Chapter 10: diagnosing hung, crashed and drifting runs (divergence checker, NaN flag, straggler)."""
