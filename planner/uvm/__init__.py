"""UVM planners: every tensor in CUDA managed memory; the plan gives the driver hints
(prefetches, advice, a backing tier) or none at all."""
