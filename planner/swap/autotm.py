"""``autotm``: a swap MILP on the interval formulation (planner/shared/ilp/), solved by
HiGHS in ``solve_swap_milp`` (planner/shared/ilp/solve.py says how it runs: the heuristic
fallback and MIP start, lowering, refinement and polish).

``autotm`` follows Hildebrand et al., "AutoTM: Automatic Tensor Movement in Heterogeneous
Memory Systems using Integer Linear Programming", ASPLOS 2020, as summarised from the
paper: per tensor, where it lives between uses (GPU, or here host memory or SSD);
asynchronous moves within a window of kernels of a use (``window``, 15 in the paper);
memory at every kernel; each kernel's time the larger of its compute and the copies
overlapped with it. Departures: a tensor's location is chosen per idle interval, not by
a flow network (equivalent for moves that go out and come back once per interval);
synchronous moves are the window's edge cases (release two ops after the last use,
prefetch issued right before the next; where the window's model has no plan, a fetch position
at the op before the use, which waits for the copy: ``candidates(sync=True)``); the write-once
saving for read-only tensors is not modelled (every moved interval is written out, R16 makes that exact for tensors
updated in place); a weight or optimizer state starts the iteration in host memory only
where an op over the budget comes before its first touch (``initial``, off by default; a wrap candidate:
fetched before its first touch, written back after its last); fragmentation does not
exist here (R2 counts bytes). The SSD tier is left out when host memory holds every
candidate and a host copy is never slower (``slower_tiers_dominated``).
"""
from __future__ import annotations

from ..core.registry import DEFAULT_OPTIONS, Param, register
from ..shared.ilp.common import HOST_HEURISTICS, START_POSITIONS, SWAP_HEURISTICS, best_heuristic
from ..shared.ilp.solve import MILP_PARAMS, solve_swap_milp


@register(
    "autotm",
    "AutoTM (ASPLOS'20): MILP over where each tensor lives between uses (GPU, host, SSD), "
    "asynchronous moves within a window of kernels, each kernel as long as its compute or its copies.",
    params=(Param("window", 15, "ops before / after a use within which a move may run", low=1, high=4096),
            Param("ssd", True, "allow the SSD tier (when the hardware has one)"),
            Param("reach", False, "positions only at ops over the budget, past the window up to the interval's "
                                  "ends (spaced out), copies in pieces between them, running-sum copy rows and "
                                  "the offload streams' FIFO queue in the model (docs/ilp.md: experimental, "
                                  "slower to solve)"),
            Param("far", 0, "release positions past the window, at ops over the budget 1, 2, 4, ... apart "
                            "(an offload queued on the link frees memory later, not never)", low=0, high=16),
            Param("initial", False, "weights and optimizer state may start the iteration in host memory, "
                                   "fetched before their first use and written back after their last"),
            START_POSITIONS) + MILP_PARAMS,
    moves_persistent=True,
    paper="Hildebrand et al., AutoTM: Automatic Tensor Movement in Heterogeneous Memory Systems "
          "using Integer Linear Programming, ASPLOS 2020",
    searches=True, family="swap",
)
def plan_autotm(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS, window=15, ssd=True, reach=False,
                far=0, initial=False, start_positions=False, polish=True, gap=1e-3, fix_above=100_000):
    tiers = ("host", "ssd") if ssd and hardware.ssd is not None else ("host",)
    heuristics = SWAP_HEURISTICS if "ssd" in tiers else HOST_HEURISTICS
    return solve_swap_milp(profile, hardware, budget_bytes, options, tiers=tiers, window=window, token=False,
                           gap=gap, fallback=best_heuristic(profile, hardware, budget_bytes, heuristics, options),
                           fix_above=fix_above, reach=reach, far=far, wrap=initial, start_positions=start_positions,
                           polish=polish)
