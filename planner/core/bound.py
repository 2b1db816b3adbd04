"""The lower bound's former home (planner/shared/bound.py is the module): kept so that
code written against ``planner.core.bound`` (scripts, notebooks, the acceptance checks)
goes on working after planner/ was regrouped by family."""
from planner.shared.bound import Bound, bound_fields, bound_words, collectives_us, lower_bound

__all__ = ["Bound", "bound_fields", "bound_words", "collectives_us", "lower_bound"]
