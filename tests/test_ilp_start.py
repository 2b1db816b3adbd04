"""The ILP planners' MIP start from the heuristic plan (planner/search/ilp/common.py
``best_start``, intervals.py ``Formulation.choices_of_plan``) and the fallback rule
(the solver's plan unless the heuristic's simulates strictly faster)."""
from __future__ import annotations

import numpy as np
import pytest

from planner.core.api import make_plan, simulator_for
from planner.core.registry import Draft, RunOptions
from planner.search.ilp.common import best_start
from planner.search.ilp.intervals import MS, Formulation, candidates, predicted_us
from planner.search.ilp.planners import solve_swap_milp
from simulator.plan import Plan, offload, prefetch
from tests.engine_helpers import machine
from tests.test_ilp import tiny

BUDGET = 163


def _feasible(form: Formulation, x: np.ndarray) -> bool:
    m = form.model
    for row in range(m.num_rows):
        lo, hi = m._starts[row], m._starts[row + 1]
        activity = float(np.dot(m._value[lo:hi], x[m._index[lo:hi]]))
        if not m.row_lower[row] - 1e-9 <= activity <= m.row_upper[row] + 1e-9:
            return False
    return all(m.lower[k] - 1e-9 <= x[k] <= m.upper[k] + 1e-9 for k in range(m.num_cols))


def _hand_plan():
    # b (60 B) out after f1, back after m4 for g2: at 10 B/us each copy takes 6 us of a 10 us op
    return [offload("b", "f1"), prefetch("b", "m4", "g2")]


def test_the_heuristic_plan_is_translated_into_the_models_choices_and_priced():
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    form = Formulation(profile, hw, BUDGET, candidates(profile, hw, BUDGET, 8, ("host",)))
    sim = simulator_for(profile, hw)
    plan = Plan(profile_name=profile.name, profile_sha256=sim.compiled.sha256, actions=tuple(_hand_plan()))
    run = sim.simulate(plan, BUDGET, record=True)
    assert run.ok and run.iteration_us == pytest.approx(profile.ideal_us)
    moved, redone, missing = form.choices_of_plan(plan.actions, run.timeline)
    (k, (release, fetch)), = moved.items()
    assert form.cands[k].tensor == "b" and missing == 0 and not redone
    assert release == 2          # the offload ended during m0 (op 1): off the GPU from m1
    assert fetch == profile.op_index["m4"]
    x = form.priced(form.values_of(moved), 10, 1)
    assert x is not None and _feasible(form, x)
    # the model's time of the start is the formulation's: every step as long as its op or its copies
    steps = x[form.T:form.T + form.n] / MS
    loads = {}
    for (i, _), (index, value) in form.step_loads.items():
        loads[i] = max(loads.get(i, 0.0), -float(np.dot(value, x[index])) / MS)
    assert np.allclose(steps, [max(t, loads.get(i, 0.0)) for i, t in enumerate(form.times)])
    assert predicted_us(form, x) == pytest.approx(run.iteration_us)


def test_best_start_takes_the_heuristics_when_the_model_times_it_fastest():
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    form = Formulation(profile, hw, BUDGET, candidates(profile, hw, BUDGET, 8, ("host",)))
    sim = simulator_for(profile, hw)
    notes: dict = {}
    x = best_start(form, sim, BUDGET, Draft(actions=_hand_plan()), 10, 1, notes)
    assert notes["start"] == "heuristic" and _feasible(form, x)
    assert notes["start_model_us"] == pytest.approx(profile.ideal_us)
    assert notes["start_moves"].startswith("1 of the heuristic's moves")


def test_a_heuristic_plan_the_model_cannot_hold_is_covered_by_more_moves():
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    form = Formulation(profile, hw, BUDGET, candidates(profile, hw, BUDGET, 8, ("host",)))
    # back one op too early: m4 would be over the budget; cover() widens the move
    moved = {k: (c.release[0], profile.op_index["m3"]) for k, c in enumerate(form.cands) if c.tensor == "b"}
    assert form.priced(form.values_of(moved), 10, 1) is None
    covered = form.cover(moved)
    x = form.priced(form.values_of(covered), 10, 1)
    assert x is not None and _feasible(form, x)


def test_the_solvers_plan_is_returned_when_it_simulates_as_fast_as_the_heuristics():
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    options = RunOptions(time_limit=10, threads=1)
    first = make_plan(profile, hw, BUDGET, "tmof", options=options)
    assert first.result.ok and "fallback" not in first.plan.planner.notes
    same = Draft(actions=list(first.plan.actions), status="heuristic")
    draft = solve_swap_milp(profile, hw, BUDGET, options, tiers=("host",), window=20, token=False, gap=1e-3,
                            fallback=lambda: same)
    assert draft.status == "optimal" and "fallback" not in draft.notes
    assert draft.notes["heuristic_us"] == draft.notes["simulated_us"]
    assert draft.notes["start"] == "heuristic"


def test_the_heuristic_is_returned_when_strictly_faster(monkeypatch):
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    options = RunOptions(time_limit=10, threads=1)
    import planner.search.ilp.planners as planners

    real = planners.score

    def biased(sim, budget, actions, initial=None, **kw):   # the heuristic's plan (scored with its
        result = real(sim, budget, actions, initial, **kw)   # initial placements) 1 us faster
        if initial is not None and result.ok:
            result.iteration_us -= 1.0
        return result

    monkeypatch.setattr(planners, "score", biased)
    draft = solve_swap_milp(profile, hw, BUDGET, options, tiers=("host",), window=20, token=False, gap=1e-3,
                            fallback=lambda: Draft(actions=_hand_plan(), status="heuristic"))
    assert draft.status == "heuristic" and draft.actions == _hand_plan()
    assert draft.notes["fallback"] == "the heuristic plan simulated faster than the solver's"
    assert draft.notes["heuristic_us"] == draft.notes["simulated_us"] - 1.0


def test_reach_positions_are_ops_over_the_budget_and_the_model_still_finds_the_optimum():
    from planner.search.ilp.intervals import windows
    # positions only at ops over the budget, the first `window` all, then spaced out to the last
    release, fetch = windows(20, 600, 15, list(range(184, 336)))
    assert release[:15] == tuple(range(184, 199)) and release[-1] == 335 and len(release) < 25
    assert fetch[-15:] == tuple(range(321, 336)) and fetch[0] == 184 and len(fetch) < 25
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    plain = Formulation(profile, hw, BUDGET, candidates(profile, hw, BUDGET, 8, ("host",)))
    reach = Formulation(profile, hw, BUDGET, candidates(profile, hw, BUDGET, 8, ("host",), reach=True), reach=True)
    a, b = plain.model.solve(10, 1, 0, 0.0), reach.model.solve(10, 1, 0, 0.0)
    assert a.status == b.status == "optimal"
    assert predicted_us(reach, b.values) == pytest.approx(predicted_us(plain, a.values))
    sim = simulator_for(profile, hw)
    x = best_start(reach, sim, BUDGET, Draft(actions=_hand_plan()), 10, 1, {})
    assert x is not None and _feasible(reach, x)
