"""Chapter 04 (first half): tensor parallelism — split linears by hand, DTensor, megatron-core."""
