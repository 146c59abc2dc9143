"""Chapter 06: fault tolerance — atomic checkpoints, restarts under torchrun, the interval."""
