"""Swap + recompute planners: each tensor that leaves GPU memory is either copied out and
back or dropped and recomputed, whichever the planner finds cheaper: capuchin, superneurons
(convolution outputs offloaded, the cheap layers recomputed), swapadvisor/ (a genetic
search), joint (one MILP over both), and best (a portfolio of the others)."""
