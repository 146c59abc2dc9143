"""Chapter 07: before you distribute — LoRA, quantized weights, their memory, the planner."""
