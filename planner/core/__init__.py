"""The framework every planner runs in: the registry (registry.py: a planner registers by
name, with its parameters and its family), the one family map (families.py: each family's
title and folder), ``make_plan`` (api.py: a planner's Draft scored by the simulator, with a
lower bound beside it), lowering decisions to plan actions (lowering.py), and the catalog
that imports each family's folder (catalog.py). The facts and models that planners of
several families share are in ``planner/shared``. Nothing here imports a planner family
by name."""
