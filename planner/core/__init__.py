"""What every planner shares: the registry and ``make_plan``, lowering decisions to plan
actions, facts about a profile, the memory estimate, the lower bound, codecs, grouping,
placement, the HiGHS wrapper, the catalog of families, and the ``none`` baseline. Nothing
here imports a planner family."""
