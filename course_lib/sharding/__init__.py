"""Chapter 03: ZeRO and FSDP — wrap a model four ways, measure each rank, the paper's formulas."""
