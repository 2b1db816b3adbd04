"""What planners of several families share, past the framework of ``planner/core``: facts
about a profile (facts.py) and the models and policies they plan with: the lower bound
(bound), the copy queue of the copy engines (copy_queue), the memory estimate (estimate),
recompute choices (regen) and segment checkpointing (checkpoint), op splits (splitting),
grouped transfers (grouping), offline placement of one arena (placement), codecs
(compression), local search on a plan's swaps (polish), the HiGHS wrapper (highs), and the
interval MILP the ILP planners solve (ilp/). Nothing here registers a planner or imports a
planner family."""
