"""Search planners: plans found by a solver or a genetic search rather than a greedy rule:
the interval MILP (ilp/: autotm, tmof, joint), deeptm on the same MILP, and SwapAdvisor's
genetic search (swapadvisor/)."""
