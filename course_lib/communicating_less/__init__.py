"""Chapter 11: communicating less (DDP's compression hooks, local SGD / DiLoCo) and surviving a
replica's failure without restarting the job (torchft)."""
