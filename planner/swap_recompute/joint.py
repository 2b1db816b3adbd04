"""``joint``: one MILP over swapping and recomputing, on the interval formulation
(planner/shared/ilp/), solved by HiGHS in ``solve_swap_milp`` (planner/shared/ilp/solve.py
says how it runs: the heuristic fallback and MIP start, lowering, refinement and polish).

``joint`` is this project's: the same intervals may instead be dropped and recomputed
(Checkmate's recompute ILP, Jain et al., MLSys 2020, on the interval form rather than
Checkmate's O(n^2) stages), with recompute chains (a source dropped across the recompute
is regenerated first) and recomputes that read a swapped source brought back early (its
prefetch due at the recompute, as Capuchin retargets it).
"""
from __future__ import annotations

from ..core.registry import DEFAULT_OPTIONS, Param, register
from ..shared.ilp.common import JOINT_SEARCH, RECOMPUTE_ALSO, RECOMPUTE_HEURISTICS, best_heuristic
from ..shared.ilp.solve import MILP_PARAMS, solve_swap_milp


@register(
    "joint",
    "One MILP over swapping to host and recomputing each idle interval (Checkmate's and OffMate's idea on "
    "the interval formulation), starting from the fastest of capuchin's, g10's and lms's plans; the fastest of "
    "those, of g10's recomputing what the link cannot move in time and of swapadvisor's search is the "
    "fallback.",
    params=(Param("window", 20, "ops before / after a use within which a move may run", low=1, high=4096),
            Param("search", True, "swapadvisor's genetic search (its time limit and seed) may be the fallback "
                                  "too, when it simulates faster than the MILP's plan"))
    + MILP_PARAMS,
    moves_persistent=True,
    recomputes=True,
    paper="Jain et al., Checkmate, MLSys 2020 (recompute ILP); Rockmate's OffMate notes (per-step channel "
          "limits): the joint formulation here is this project's",
    searches=True, family="swap + recompute",
)
def plan_joint(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, window=20, search=True, polish=True,
               gap=1e-3, fix_above=100_000):
    also = RECOMPUTE_ALSO + (JOINT_SEARCH if search else ())
    return solve_swap_milp(profile, hardware, budget_bytes, options, tiers=("host",), window=window, token=False,
                           gap=gap, fallback=best_heuristic(profile, hardware, budget_bytes, RECOMPUTE_HEURISTICS,
                                                            options, also=also),
                           recompute_too=True, fix_above=fix_above, polish=polish)
