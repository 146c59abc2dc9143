"""Chapter 05: communication and scaling — collectives benchmarked, the α-β model, what-if."""
