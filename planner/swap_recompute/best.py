"""``best``: a portfolio for a user with no time to compare. The greedy planners that plan
in seconds run first, then the searching ones (SwapAdvisor's genetic search, the joint
swap + recompute MILP) with the time left of the run's limit (``--time-limit``, 60 s by
default); every plan is simulated on the run's Simulator and the fastest that fits is
returned, with the planner that made it and what every other one gave in its notes.

Not from a paper: it is how practitioners use these tools (try the cheap ones, spend the
rest of the budget on a search), written as one planner so that `plan`, `compare` and
`train` can ask for it by name. A plan it returns is some planner's own plan, unchanged.
"""
from __future__ import annotations

import time
from dataclasses import replace

from simulator.errors import SwapplanError

from ..core.api import can_meet, score, simulator_for
from ..core.registry import DEFAULT_OPTIONS, Draft, get_planner, register

# (planner, parameters): g10 recomputes what the link cannot move out in time (never slower than its
# own plan: SENet-154 b1024 on G10's machine 1.042x against 1.244x); seconds each
FAST = (("capuchin", {}), ("g10", {"recompute": True}), ("lms", {}), ("flashneuron", {}), ("vdnn", {}),
        ("chen", {}), ("torch-budget", {}))
SEARCHING = (("swapadvisor", {}), ("joint", {}))                                     # the time left
DEFAULT_LIMIT_S = 60.0
FAST_SHARE = 0.3    # once a plan runs, no more fast planners past this share of the limit (issue 53)


@register("best", "A portfolio: the fast planners (capuchin, g10 with recompute, lms, flashneuron, vdnn, chen, "
                  "torch-budget), then swapadvisor and joint with the time left of --time-limit (60 s by default); "
                  "the fastest plan that fits, and which planner made it.",
          moves_persistent=True, recomputes=True, searches=True, family="swap + recompute")
def plan_best(profile, hardware, budget_bytes, *, options=DEFAULT_OPTIONS) -> Draft:
    started = time.perf_counter()
    limit = options.time_limit if options.time_limit is not None else DEFAULT_LIMIT_S
    sim = simulator_for(profile, hardware, options)
    tried: dict[str, object] = {}
    best = None
    slowest = 0.0   # the slowest fast planner's seconds
    for name, params in FAST + SEARCHING:
        searching = (name, params) in SEARCHING
        left = limit - (time.perf_counter() - started)
        if searching and left < 1.0 + slowest:   # a search plans its seeds (fast planners) again first
            tried[name] = "no time left" if left < 1.0 else f"{left:.1f} s left, under the seeds' {slowest:.1f} s"
            continue
        if not can_meet(name, params, profile, hardware, budget_bytes):
            tried[name] = "cannot meet the budget (its floor is above it)"
            continue
        if not searching and best is not None and not best[0][0] and options.past(started, FAST_SHARE):
            tried[name] = f"not planned: the fast planners had used {FAST_SHARE:.0%} of the time limit"
            continue
        spec = get_planner(name)
        options.say(f"best: {name}" + (f" ({left:.0f} s left)" if searching else ""))
        run = replace(options, simulator=sim, time_limit=left if searching else options.time_limit)
        began = time.perf_counter()
        try:
            draft = spec.func(profile, hardware, budget_bytes, options=run, **spec.resolve(params))
        except SwapplanError as exc:   # e.g. no optimizer ops for a planner that needs them
            tried[name] = f"no plan: {exc}"[:200]
            continue
        finally:
            if not searching:
                slowest = max(slowest, time.perf_counter() - began)
        result = score(sim, budget_bytes, draft.actions, draft.initial, draft.schedule, draft.cpu_ops, draft.memory,
                       draft.read_mostly, draft.allow_lossy, draft.variants, draft.placement)
        tried[name] = round(result.iteration_us, 3) if result.ok else f"does not fit ({result.rule})"
        key = (not result.ok, result.iteration_us if result.ok else -result.progress)
        if best is None or key < best[0]:
            best = (key, name, draft)
    if best is None:
        return Draft(status="infeasible", notes={"tried": tried})
    _, name, draft = best
    return replace(draft, notes={"chosen": name, "chosen_status": draft.status, "chosen_notes": draft.notes,
                                 "tried": tried})
