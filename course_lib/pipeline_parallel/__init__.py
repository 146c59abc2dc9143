"""Chapter 04 (second half): pipeline parallelism — stages, GPipe and 1F1B, the bubble."""
