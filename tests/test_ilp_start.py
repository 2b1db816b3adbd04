"""The ILP planners' MIP start from the heuristic plan (planner/search/ilp/common.py
``best_start``, intervals.py ``Formulation.choices_of_plan``) and the fallback rule
(the solver's plan unless the heuristic's simulates strictly faster)."""
from __future__ import annotations

import numpy as np
import pytest

from planner.core.api import make_plan, simulator_for
from planner.core.registry import Draft, RunOptions
from planner.shared.ilp.common import best_heuristic, best_start, offload_points, short_op, to_actions
from planner.shared.ilp.candidates import MS, Candidate, candidates
from planner.shared.ilp.decode import Chosen, predicted_us
from planner.shared.ilp.rows import Formulation
from planner.shared.ilp.solve import solve_swap_milp
from simulator.plan import Plan, offload, prefetch
from tests.conftest import make_profile
from tests.engine_helpers import machine
from tests.test_ilp import tiny
from tests.test_ilp_refine import _long_gap

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
                            fallback=lambda start=False: same)
    assert draft.status == "optimal" and "fallback" not in draft.notes
    assert draft.notes["heuristic_us"] == draft.notes["simulated_us"]
    assert draft.notes["start"] == "heuristic"
    assert draft.notes["improved_start"] is False   # the start is the optimum: the note says the plan is the start's


def test_a_solution_the_solver_improved_from_its_start_is_not_marked_as_the_start(monkeypatch):
    # b fetched back after m1 holds memory at m2-m4 (over the budget): at the window's positions the start
    # prices at 86 us in the model, the solver moves more and reaches 80 us (without the start around the
    # LP relaxation, which is that optimum here: the next test)
    import planner.shared.ilp.common as common
    monkeypatch.setattr(common, "_around_relaxation", lambda form, limit, threads: None)
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    late = Draft(actions=[offload("b", "f1"), prefetch("b", "m1", "g2")], status="heuristic")
    draft = solve_swap_milp(profile, hw, BUDGET, RunOptions(time_limit=10, threads=1), tiers=("host",), window=20,
                            token=False, gap=1e-3, fallback=lambda start=False: late)
    assert draft.notes["start"] == "heuristic" and draft.notes["start_model_us"] == pytest.approx(86.0)
    assert draft.notes["model_objective_us"] == pytest.approx(80.0) and "improved_start" not in draft.notes
    # read at the positions it ran at (its prefetch's copy waits for memory, R10: the fetch is read off the
    # copy's start, a position the window has) the model prices the same plan at 80 us, the solver's optimum
    draft = solve_swap_milp(profile, hw, BUDGET, RunOptions(time_limit=10, threads=1), tiers=("host",), window=20,
                            token=False, gap=1e-3, fallback=lambda start=False: late, start_positions=True)
    assert draft.notes["start_positions"] == 0 and draft.notes["start_model_us"] == pytest.approx(80.0)
    assert draft.notes["model_objective_us"] == pytest.approx(80.0)


def test_the_mip_around_the_relaxation_starts_the_solver_at_its_optimum():
    # the same graph and late start (86 us in the model): the MIP around the LP relaxation is the optimum,
    # 80 us, so it is the start, and the solver's plan has its choices
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    late = Draft(actions=[offload("b", "f1"), prefetch("b", "m1", "g2")], status="heuristic")
    draft = solve_swap_milp(profile, hw, BUDGET, RunOptions(time_limit=10, threads=1), tiers=("host",), window=20,
                            token=False, gap=1e-3, fallback=lambda start=False: late)
    assert draft.notes["start"] == "relaxation" and draft.notes["start_model_us"] == pytest.approx(80.0)
    assert draft.notes["model_objective_us"] == pytest.approx(80.0) and draft.notes["improved_start"] is False


def test_the_heuristic_is_returned_when_strictly_faster(monkeypatch):
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    options = RunOptions(time_limit=10, threads=1)
    import planner.shared.ilp.solve as planners

    real = planners.score

    calls = []

    def biased(sim, budget, actions, initial=None, *args, **kw):   # the heuristic's plan (the first one
        calls.append(1)                                      # scored) 1 us faster
        result = real(sim, budget, actions, initial, *args, **kw)
        if len(calls) == 1 and result.ok:
            result.iteration_us -= 1.0
        return result

    monkeypatch.setattr(planners, "score", biased)
    draft = solve_swap_milp(profile, hw, BUDGET, options, tiers=("host",), window=20, token=False, gap=1e-3,
                            fallback=lambda start=False: Draft(actions=_hand_plan(), status="heuristic"))
    assert draft.status == "heuristic" and draft.actions == _hand_plan()
    assert draft.notes["fallback"] == "the heuristic plan simulated faster than the solver's"
    assert draft.notes["heuristic_us"] == draft.notes["simulated_us"] - 1.0


def test_reach_positions_are_ops_over_the_budget_and_the_model_still_finds_the_optimum():
    from planner.shared.ilp.positions import windows
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


# s (60 B, a weight) is touched once, by the update u near the end; a (100 B) is read by every op
# in between and cannot move. Over the budget of 163 at m0..m3 (164 B): only s starting the
# iteration in host memory, fetched before u and written back after it, frees memory there.
WRAP_TENSORS = {"a": (100, "activation"), "s": (60, "weight"), "ga": (1, "gradient"), "z": (1, "activation")}
WRAP_OPS = [("f1", "forward", 10.0, [], ["a"])]
for _k in range(4):
    WRAP_TENSORS[f"c{_k}"] = (2, "activation")
    WRAP_OPS.append((f"m{_k}", "forward", 10.0, ["a"] + ([f"c{_k - 1}"] if _k else []), [f"c{_k}"]))
WRAP_OPS += [("g1", "backward", 10.0, ["a", "c3"], ["ga"]), ("u", "optimizer", 10.0, ["ga"], [], ["s"]),
             ("y", "optimizer", 10.0, [], ["z"])]


def test_a_weight_may_start_the_iteration_in_host_memory():
    from planner.shared.ilp.candidates import wrap_candidates
    from tests.conftest import make_profile
    profile, hw = make_profile(WRAP_TENSORS, WRAP_OPS, "ilp-wrap"), machine(h2d=0.01, d2h=0.01)
    (c,) = wrap_candidates(profile, hw, BUDGET, window=8)
    # fetched after one of f1..m3 (back on the GPU from the next op), written back after u (position 6)
    assert (c.tensor, c.after, c.before, c.wraps, c.fetch) == ("s", 6, 6, True, (0, 1, 2, 3, 4))
    assert list(c.span) == [0, 1, 2, 3, 4]
    planned = make_plan(profile, hw, BUDGET, "autotm", {"initial": True}, options=RunOptions(time_limit=10, threads=1))
    notes = planned.plan.planner.notes
    assert "fallback" not in notes and notes["start_in_host"] == 1
    assert planned.plan.initial == {"s": "host"}
    # its 6 us prefetch runs under g1, its 6 us write-back under y: no overhead
    assert planned.result.ok and planned.result.iteration_us == pytest.approx(profile.ideal_us)
    kinds = [(a.kind, a.tensor, a.after) for a in planned.plan.actions]
    assert kinds == [("prefetch", "s", "m3"), ("offload", "s", "u")]
    off = make_plan(profile, hw, BUDGET, "autotm", {"initial": False}, options=RunOptions(time_limit=10, threads=1))
    assert "fallback" in off.plan.planner.notes   # without it no interval in the model relieves m0..m3


def test_ssd_moves_are_left_out_when_host_memory_holds_every_candidate():
    from planner.shared.ilp.candidates import slower_tiers_dominated
    profile = tiny()
    fast_ssd = dict(h2d=0.01, d2h=0.01, ssd_read=0.01, ssd_write=0.01)   # as fast as PCIe, and behind it
    roomy, small = machine(**fast_ssd), machine(**fast_ssd, host="100B")
    both = candidates(profile, roomy, BUDGET, 8, ("host", "ssd"))
    assert {c.tier for c in both} == {"host", "ssd"}
    assert slower_tiers_dominated(roomy, both)
    assert not slower_tiers_dominated(small, candidates(profile, small, BUDGET, 8, ("host", "ssd")))
    planned = make_plan(profile, roomy, BUDGET, "autotm", {}, options=RunOptions(time_limit=10, threads=1))
    assert planned.plan.planner.notes["tiers"] == ["host"]


def test_far_positions_reach_the_ops_over_the_budget_past_the_window():
    from planner.shared.ilp.positions import early_fetches, late_releases, log_spaced
    assert log_spaced(10, 3) == [0, 1, 3] and log_spaced(3, 5) == [0, 1, 2] and log_spaced(0, 3) == []
    over = [20, 21, 22, 23, 24, 30, 40]
    # releases past a window ending at op 12, before the first fetch position 35: over ops 20, 21, 23
    assert late_releases(12, over, (35, 36), 3) == (20, 21, 23)
    # fetches before a window starting at 38, from op 21 on: counting back from 30: 30, 24, 22
    assert early_fetches(21, over, (38, 39), 3) == (22, 24, 30)
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    for c in candidates(profile, hw, BUDGET, 1, ("host",), far=2):
        assert list(c.release) == sorted(set(c.release)) and list(c.fetch) == sorted(set(c.fetch))
        assert c.release[-1] <= c.fetch[-1]


def _reread():
    # t (50 B) made by p, read by r1 and r2, idle over i3-i5, read by u6 and r7, idle over i8-i10, read by r11
    tensors = {"t": (50, "activation"), "out": (1, "activation")}
    ops = [("p", "forward", 10.0, [], ["t"])]
    reads = {1: "r1", 2: "r2", 6: "u6", 7: "r7", 11: "r11"}
    for k in range(1, 12):
        tensors[f"c{k}"] = (2, "activation")
        name = reads.get(k, f"i{k}")
        ins = (["t"] if k in reads else []) + ([f"c{k - 1}"] if k > 1 else [])
        ops.append((name, "forward" if k < 9 else "backward", 10.0, ins, [f"c{k}"]))
    ops.append(("end", "backward", 10.0, ["c11"], ["out"]))
    return make_profile(tensors, ops, "ilp-reread")


def test_early_offloads_are_issued_after_the_last_write_or_the_last_arrival():
    profile, hw = _reread(), machine(h2d=0.01, d2h=0.01)
    first = Chosen(Candidate("t", 50, 2, 6, "host", (3,), (5,), 5.0, 5.0), release=3, fetch=5, done=5)
    second = Chosen(Candidate("t", 50, 7, 11, "host", (8,), (10,), 5.0, 5.0), release=8, fetch=10, done=10)
    # the first: back past r2 and r1 (reads) to p, which makes t; the second: back to u6, which the first
    # move brought t back for; without the first move, back to p
    assert offload_points(profile, [first, second]) == [0, 6]
    assert offload_points(profile, [second]) == [0]
    assert offload_points(profile, [first, second], chains=[(3, "t")]) == [2, 7]   # recomputed: at the last use
    sim = simulator_for(profile, hw)
    for early in (False, True):
        actions = to_actions(profile, [first, second], early_offloads=early)
        assert [a.after for a in actions if a.kind == "offload"] == (["p", "u6"] if early else ["r2", "r7"])
        plan = Plan(profile_name=profile.name, profile_sha256=sim.compiled.sha256, actions=tuple(actions))
        run = sim.simulate(plan, 10**6, record=True)
        assert run.ok, run
        start = min(s.start_us for s in run.timeline.spans if s.args.get("kind") == "offload")
        assert start == pytest.approx(10.0 if early else 30.0)   # the copy starts when its issue op ends


def test_an_offload_issued_before_the_last_use_is_the_intervals_move_in_the_start():
    # LMS issues offloads right after the producer: the move still frees t over the gap before its next use
    profile, hw = _reread(), machine(h2d=0.01, d2h=0.01)
    budget = max(profile.resident_bytes) - 1
    form = Formulation(profile, hw, budget, candidates(profile, hw, budget, 8, ("host",)))
    assert [(c.after, c.before) for c in form.cands] == [(2, 6), (7, 11)]
    moved, _, missing = form.choices_of_plan([offload("t", "p"), prefetch("t", "i5", "u6"),
                                              offload("t", "u6"), prefetch("t", "i10", "r11")])
    assert moved == {0: (4, 4), 1: (9, 9)} and missing == 0


def test_the_start_keeps_the_heuristics_recomputes_the_model_can_hold():
    # the chain graph (tests/test_ilp.py) at 183 B: 97 B too many at each of the five m ops. Dropping x
    # alone frees 60 B; the rest would have to be s or w moved, but x's recompute before gx reads both inside
    # their intervals, so more moves cannot cover the m ops and the model has no plan with that recompute
    # alone (R13): the start keeps none of it. Dropping s as well frees 120 B: both are kept.
    from planner.shared.ilp.common import _recomputes_that_fit
    from planner.shared.ilp.candidates import recomputes
    from tests.test_ilp import CHAIN_OPS, CHAIN_TENSORS
    profile, hw = make_profile(CHAIN_TENSORS, CHAIN_OPS, "ilp-chain"), machine(h2d=0.0001, d2h=0.0001)
    form = Formulation(profile, hw, 183, candidates(profile, hw, 183, 8, ("host",)), redo=recomputes(profile, 183))
    kx, ks = (next(k for k, r in enumerate(form.redo) if r.tensor == t) for t in ("x", "s"))
    short: list[int] = []
    out = form.cover({}, {kx}, short)
    assert not any(form.cands[k].tensor in ("s", "w") for k in out) and short == [3, 4, 5, 6, 7]
    assert form.priced(form.values_of(out, {kx}), 10, 1) is None
    assert _recomputes_that_fit(form, {}, {kx}) == set()
    both = {kx, ks}
    assert _recomputes_that_fit(form, {}, both) == both
    assert form.priced(form.values_of(form.cover({}, both), both), 10, 1) is not None


def test_the_last_resort_heuristic_runs_only_when_none_of_the_pool_runs():
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    options = RunOptions(time_limit=10, threads=1)
    # "none" does not fit BUDGET (below the peak): lms, the last resort, is planned and returned
    draft = best_heuristic(profile, hw, BUDGET, (("none", {}),), options, last_resort=(("lms", {}),))()
    assert draft.notes["heuristic"] == "lms" and draft.actions
    # lms fits: the last resort is never planned (an unknown name would raise if it were)
    draft = best_heuristic(profile, hw, BUDGET, (("lms", {}),), options, last_resort=(("no-such-planner", {}),))()
    assert draft.notes["heuristic"] == "lms"


def test_an_infeasible_model_names_the_op_no_move_can_relieve():
    # _long_gap: t (50 B) may be off the GPU at ops 3-11 (its window positions); w (60 B) is made by i8 and read
    # by i9, so nothing else can leave at op 8. With a budget 60 B under op 8's resident bytes, moving t
    # frees 50 of them: 10 B short there, and the solver falls back naming the op
    profile, hw = _long_gap(), machine(h2d=0.001, d2h=0.001)
    budget = int(profile.resident_bytes[8]) - 60
    form = Formulation(profile, hw, budget, candidates(profile, hw, budget, 2, ("host",)))
    assert [c.tensor for c in form.cands] == ["t"] and form.over_ops[0] <= 8
    assert short_op(form) == ("i8", 10)
    draft = solve_swap_milp(profile, hw, budget, RunOptions(time_limit=10, threads=1), tiers=("host",), window=2,
                            token=False, gap=1e-3, fallback=lambda start=False: Draft(actions=[], status="heuristic"))
    assert draft.status == "heuristic" and "at op 'i8', 10 bytes more than every move" in draft.notes["fallback"]


@pytest.mark.parametrize("planner", ["autotm", "tmof"])
def test_a_use_may_wait_for_its_prefetch_where_the_window_holds_no_plan(planner):
    # _long_gap with y (60 B) made by i11 and read by i12: at i12 t (50 B) must be off the GPU, but the window
    # fetches it after i11 at the latest (resident at i12): no plan in the window's model. With a synchronous
    # fetch position (after i12, u13 waits) the model has one: 15 ops of 10 us and u13 waiting for t's 50 us
    # copy (1 B/us), 200 us, as simulated
    profile, hw = _long_gap(late=60), machine(h2d=0.001, d2h=0.001)
    budget = int(profile.resident_bytes[12]) - 50
    form = Formulation(profile, hw, budget, candidates(profile, hw, budget, 2, ("host",)))
    assert short_op(form) == ("i12", 50)
    synced = Formulation(profile, hw, budget, candidates(profile, hw, budget, 2, ("host",), sync=True))
    assert [c.fetch for c in synced.cands] == [(10, 11, 12)] and synced.cands[0].synchronous
    assert short_op(synced) is None
    planned = make_plan(profile, hw, budget, planner, {"window": 2}, options=RunOptions(time_limit=10, threads=1))
    notes = planned.plan.planner.notes
    assert notes["synchronous_fetches"] == 1 and "fallback" not in notes
    assert planned.result.ok and planned.result.iteration_us == pytest.approx(200.0)
    assert notes["model_objective_us"] == pytest.approx(200.0)
    assert [(a.kind, a.after) for a in planned.plan.actions if a.tensor == "t"][-1] == ("prefetch", "i12")
