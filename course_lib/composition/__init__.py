"""Chapter 09: composing parallelisms on a DeviceMesh (2-D FSDP × TP, HSDP, expert parallel)."""
