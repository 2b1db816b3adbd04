"""``tmof``: a host-only swap MILP on the interval formulation (planner/shared/ilp/), solved by
HiGHS in ``solve_swap_milp`` (planner/shared/ilp/solve.py says how it runs: the heuristic
fallback and MIP start, lowering, refinement and polish).

``tmof`` follows the spirit of Lin et al., "TMOF: Tensor Movement Orchestration Framework
for ...", HPCA 2023, whose MILP is not public: host memory only, the two PCIe directions
as separate channels that overlap (bidirectional overlapping), and TMOF's
channel-contention avoidance as a token: no two offloads in flight in any step. Departure:
TMOF's disjoint swapping between GPUs has no counterpart on one GPU.
"""
from __future__ import annotations

from ..core.registry import DEFAULT_OPTIONS, Param, register
from ..shared.ilp.common import HOST_HEURISTICS, START_POSITIONS, best_heuristic
from ..shared.ilp.solve import MILP_PARAMS, solve_swap_milp


@register(
    "tmof",
    "TMOF (HPCA'23), in spirit: host-only swap MILP with the two PCIe directions overlapping; "
    "its channel-contention token (one offload in flight) optional.",
    params=(Param("window", 20, "ops before / after a use within which a move may run", low=1, high=4096),
            Param("token", False, "TMOF's contention avoidance as a constraint: never two offloads in flight "
                                  "in one step (FIFO streams already serialise them; this also forbids issuing "
                                  "one while another runs, and makes the MILP much harder)"),
            START_POSITIONS) + MILP_PARAMS,
    moves_persistent=True,
    paper="Lin et al., TMOF: tensor movement orchestration, HPCA 2023 (formulation not public: "
          "this one is written in its spirit)",
    searches=True, family="swap",
)
def plan_tmof(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, window=20, token=False,
              start_positions=False, polish=True, gap=1e-3, fix_above=100_000):
    return solve_swap_milp(profile, hardware, budget_bytes, options, tiers=("host",), window=window, token=token,
                           gap=gap, fallback=best_heuristic(profile, hardware, budget_bytes, HOST_HEURISTICS, options),
                           fix_above=fix_above, start_positions=start_positions, polish=polish)
