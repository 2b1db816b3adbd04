"""The ILP planners: one interval MILP (intervals.py) solved by HiGHS (highs.py), and the
planners built on it (planners.py)."""
from . import planners  # noqa: F401  (registers autotm and tmof)
