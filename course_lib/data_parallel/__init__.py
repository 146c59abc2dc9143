"""Chapter 02: data parallelism — collectives, DDP by hand, DDP's internals, common mistakes."""
