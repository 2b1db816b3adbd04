"""The ILP planners: one interval MILP (intervals.py) solved by HiGHS (planner/core/highs.py),
what the planners on it share (common.py: limits, LP-guided fixing, lowering a solution),
and the planners built on it (planners.py; deeptm, in planner/search/deeptm.py, uses the
same MILP)."""
from . import planners  # noqa: F401  (registers autotm, tmof and joint)
