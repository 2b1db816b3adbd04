"""The ILP planners (planner/search/ilp): the interval MILP against brute force on a tiny graph,
zero overhead above the peak, prediction against simulation, never worse than the
fallback, honest solver status, determinism."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.core.api import make_plan
from planner.shared.ilp.candidates import MS, candidates
from planner.shared.ilp.rows import Formulation
from planner.shared.ilp.decode import decode
from planner.core.registry import RunOptions
from simulator.hardware import load_hardware
from tests.conftest import make_profile
from tests.engine_helpers import machine
from tracer.synthetic import synthesize

# f1 makes a (100 B) and b (60 B); five 10 us ops run while they idle (each makes a small c*);
# g1 reads a, g2 reads b. No-swap memory 160, 162, 164 x 4, 163, 62: a budget of 163 needs
# b away during m1-m4 (a is read by g1 right after m4, so it cannot be away there).
TENSORS = {"a": (100, "activation"), "b": (60, "activation"), "ga": (1, "gradient"), "gb": (1, "gradient")}
OPS = [("f1", "forward", 10.0, [], ["a", "b"])]
for k in range(5):
    TENSORS[f"c{k}"] = (2, "activation")
    OPS.append((f"m{k}", "forward", 10.0, [f"c{k - 1}"] if k else [], [f"c{k}"]))
OPS += [("g1", "backward", 10.0, ["a", "c4"], ["ga"]), ("g2", "backward", 10.0, ["b", "ga"], ["gb"])]


def tiny():
    return make_profile(TENSORS, OPS, "ilp-tiny")


def _model_optimum_by_enumeration(form: Formulation) -> float:
    """Every choice of moves, releases and fetches, each priced by the LP over the rest."""
    choices = []
    for c in form.cands:
        choices.append([None] + [(r, f) for r in c.release for f in c.fetch if r <= f])
    best = np.inf
    model = form.model
    for pick in itertools.product(*choices):
        lower, upper = list(model.lower), list(model.upper)
        for k, (c, choice) in enumerate(zip(form.cands, pick)):
            col = form.cols[k]
            for i, r in enumerate(c.release):
                on = choice is not None and r >= choice[0]
                model.lower[col.Y + i] = model.upper[col.Y + i] = float(on)
            for i, f in enumerate(c.fetch):
                on = choice is not None and f >= choice[1]
                model.lower[col.Z + i] = model.upper[col.Z + i] = float(on)
        solution = model.solve(10, 1, 0, 0.0)
        model.lower, model.upper = lower, upper
        if solution.objective is not None:
            best = min(best, solution.objective)
    return best


def test_the_milp_finds_the_optimum_enumeration_finds():
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)   # 10 B/us: a copy of a takes 10 us
    form = Formulation(profile, hw, 163, candidates(profile, hw, 163, 8, ("host",)))
    assert len(form.cands) == 2
    solution = form.model.solve(10, 1, 0, 0.0)
    assert solution.status == "optimal"
    assert solution.objective == pytest.approx(_model_optimum_by_enumeration(form), rel=1e-6)
    moved = decode(form, solution.values)
    assert "b" in [m.candidate.tensor for m in moved]


def test_the_plan_fits_and_the_model_predicts_the_simulation():
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    planned = make_plan(profile, hw, 163, "tmof")
    report = planned.plan.planner
    assert planned.result.ok and report.status == "optimal" and report.gap is not None and report.gap <= 1e-3
    assert report.notes["moved"] >= 1
    assert planned.result.iteration_us == pytest.approx(report.estimate_us, rel=0.02)


def test_above_the_peak_nothing_moves_and_the_plan_is_optimal():
    profile = tiny()
    planned = make_plan(profile, machine(), profile.peak_bytes, "autotm")
    assert planned.plan.actions == () and planned.plan.planner.status == "optimal"
    assert planned.result.overhead == 0.0


@pytest.fixture(scope="module")
def transformer():
    return synthesize("transformer", layers=4, batch=8, seq=512), load_hardware("a100-40gb-pcie4")


@pytest.mark.parametrize("planner", ["autotm", "tmof"])
def test_on_a_synthetic_graph_prediction_and_simulation_agree_and_the_fallback_never_wins_by_much(transformer, planner):
    profile, hw = transformer
    budget = int(0.75 * profile.peak_bytes)
    planned = make_plan(profile, hw, budget, planner, options=RunOptions(time_limit=20, threads=1))
    notes = planned.plan.planner.notes
    assert planned.result.ok
    # the bound is on the first model's plans; refinement adds positions, so it bounds the first objective
    assert notes["model_bound_us"] <= notes.get("first_model_objective_us", notes["model_objective_us"]) * (1 + 1e-9)
    assert notes["simulated_us"] == pytest.approx(notes["model_objective_us"], rel=0.02)
    fallback = make_plan(profile, hw, budget, "g10", {"ssd": str(planner == "autotm")})
    assert planned.result.iteration_us <= fallback.result.iteration_us * (1 + 1e-9)


def test_same_seed_one_thread_same_plan(transformer):
    profile, hw = transformer
    budget = int(0.75 * profile.peak_bytes)
    runs = [make_plan(profile, hw, budget, "tmof", options=RunOptions(seed=3, time_limit=20, threads=1))
            for _ in range(2)]
    assert runs[0].plan.actions == runs[1].plan.actions


def test_the_start_solution_is_feasible_in_the_model():
    profile, hw = tiny(), machine(h2d=0.01, d2h=0.01)
    form = Formulation(profile, hw, 163, candidates(profile, hw, 163, 8, ("host",)))
    x = form.start()
    assert x is not None
    m = form.model
    starts = m._starts
    for row in range(m.num_rows):
        index, value = m._index[starts[row]:starts[row + 1]], m._value[starts[row]:starts[row + 1]]
        activity = float(np.dot(value, x[index]))
        assert m.row_lower[row] - 1e-9 <= activity <= m.row_upper[row] + 1e-9
    assert x[form.T:form.T + form.n].sum() >= profile.ideal_us * MS - 1e-9


def test_joint_recomputes_where_a_copy_would_cost_more():
    # a 0.1 B/us link: moving b costs 600 us each way; recomputing it (f1, 10 us) is cheaper
    profile, hw = tiny(), machine(h2d=0.0001, d2h=0.0001)
    planned = make_plan(profile, hw, 163, "joint", {"search": False}, options=RunOptions(time_limit=20, threads=1))
    kinds = [(a.kind, a.tensor) for a in planned.plan.actions]
    assert ("recompute", "b") in kinds and ("drop", "b") in kinds and not any(k == "offload" for k, _ in kinds)
    notes = planned.plan.planner.notes
    assert planned.result.ok and planned.plan.planner.status == "optimal" and notes["recomputed"] == 1
    assert planned.result.iteration_us == pytest.approx(notes["model_objective_us"], rel=0.02)


def test_joint_never_reads_a_source_inside_its_moved_interval(transformer):
    profile, hw = transformer
    budget = int(0.8 * profile.peak_bytes)
    planned = make_plan(profile, hw, budget, "joint", {"search": False}, options=RunOptions(time_limit=20, threads=1))
    assert planned.result.valid and planned.result.ok
    assert planned.result.iteration_us <= make_plan(profile, hw, budget, "capuchin").result.iteration_us * (1 + 1e-9)


# A recompute chain: s = fs(in), x = fx(s, w); x is read by gx, s later by gs. Five ops with
# 100 B workspace between force both away; copies are slow (0.1 B/us), so the plan drops
# both and recomputes them; x's recompute before gx reads s, which is then dropped across
# gx: s is regenerated there first (a chain), held through gx and dropped again.
CHAIN_TENSORS = {"in": (10, "activation"), "w": (50, "weight"), "s": (60, "activation"),
                 "x": (60, "activation"), "gxo": (1, "gradient"), "gso": (1, "gradient"), "gw": (1, "gradient")}
CHAIN_OPS = [("f0", "forward", 10.0, [], ["in"]), ("fs", "forward", 10.0, ["in"], ["s"]),
             ("fx", "forward", 10.0, ["s", "w"], ["x"])]
CHAIN_OPS += [(f"m{k}", "forward", 10.0, [], [], [], 100) for k in range(5)]
CHAIN_OPS += [("gx", "backward", 10.0, ["x"], ["gxo"]), ("gs", "backward", 10.0, ["s", "gxo"], ["gso"]),
              ("gw", "backward", 10.0, ["w", "in", "gso"], ["gw"])]


def test_joint_recomputes_a_chain_and_the_model_prices_it():
    profile, hw = make_profile(CHAIN_TENSORS, CHAIN_OPS, "ilp-chain"), machine(h2d=0.0001, d2h=0.0001)
    budget = 183   # at the m ops 280 B without a plan; at gx, s regenerated and x: 183
    options = RunOptions(time_limit=20, threads=1)
    planned = make_plan(profile, hw, budget, "joint", {"search": False, "polish": False}, options=options)
    actions = [(a.kind, a.tensor, a.after or a.before) for a in planned.plan.actions]
    assert planned.result.ok, planned.result.reason
    assert ("recompute", "s", "gx") in actions and ("recompute", "x", "gx") in actions
    assert actions.index(("recompute", "s", "gx")) < actions.index(("recompute", "x", "gx"))
    assert ("drop", "s", "gx") in actions and ("recompute", "s", "gs") in actions
    notes = planned.plan.planner.notes
    assert notes["chain_recomputes"] == 1 and planned.plan.planner.status == "optimal"
    # the ideal 110 us, plus fx and fs again before gx and fs again before gs
    assert notes["model_objective_us"] == pytest.approx(140.0)
    assert planned.result.iteration_us == pytest.approx(140.0)
    # polish keeps s from gx to gs instead (it fits there): fs runs again once, 130 us
    polished = make_plan(profile, hw, budget, "joint", {"search": False}, options=options)
    actions = [(a.kind, a.tensor, a.after or a.before) for a in polished.plan.actions]
    assert ("drop", "s", "gx") not in actions and ("recompute", "s", "gs") not in actions
    assert polished.result.iteration_us == pytest.approx(130.0) and polished.plan.planner.notes["polish"]["changes"] == 1


def test_joint_never_moves_a_weight_across_a_recompute_that_reads_it():
    # the chain graph with a 300 B weight, two more ops before the peak and 400 B of
    # workspace there: w must be away at the m ops and fx recomputes x before gx, reading w;
    # a model that let w's prefetch overlap gx (cheaper) would make that recompute invalid;
    # the model's plan as the simulator runs it, unpolished (polish finds 140 us: w's copy
    # out issued at the start, while the ops before its old place read it)
    tensors = dict(CHAIN_TENSORS, w=(300, "weight"))
    ops = CHAIN_OPS[:3] + [("p0", "forward", 10.0, [], []), ("p1", "forward", 10.0, [], [])]
    ops += [(f"m{k}", "forward", 10.0, [], [], [], 400) for k in range(5)] + CHAIN_OPS[-3:]
    profile, hw = make_profile(tensors, ops, "ilp-chain"), machine(h2d=0.01, d2h=0.01)
    planned = make_plan(profile, hw, 470, "joint", {"search": False, "polish": False},
                        options=RunOptions(time_limit=20, threads=1))
    notes = planned.plan.planner.notes
    assert notes["simulated_us"] is not None   # the solver's own plan runs, not only the fallback
    assert notes["recomputed"] >= 1 and planned.result.ok
    assert notes["simulated_us"] == pytest.approx(notes["model_objective_us"], rel=0.02)


def retarget_graph():
    """The chain graph with a cheap fx and two ops of slack on each side of the m ops, and its machine."""
    ops = [o if o[0] != "fx" else ("fx", "forward", 5.0, ["s", "w"], ["x"]) for o in CHAIN_OPS]
    pad = [("p0", "forward", 10.0, [], []), ("p1", "forward", 10.0, [], [])]
    ops = ops[:3] + pad + ops[3:8] + [("q" + o[0][1:],) + o[1:] for o in pad] + ops[8:]
    return make_profile(CHAIN_TENSORS, ops, "ilp-retarget"), machine(h2d=0.003, d2h=0.003)


def test_joint_recomputes_from_a_source_it_brings_back_early():
    # the retarget graph: s goes to host memory and x is recomputed before gx from s, so s's
    # prefetch is due at gx (the recompute reads it there), not at gs where its interval ends
    profile, hw = retarget_graph()
    planned = make_plan(profile, hw, 200, "joint", {"search": False}, options=RunOptions(time_limit=20, threads=1))
    actions = [(a.kind, a.tensor, a.before) for a in planned.plan.actions if a.kind in ("prefetch", "recompute")]
    assert ("prefetch", "s", "gx") in actions and ("recompute", "x", "gx") in actions
    notes = planned.plan.planner.notes
    assert planned.result.ok and notes["simulated_us"] == pytest.approx(notes["model_objective_us"], rel=0.02)


def test_lp_guided_fixing_reduces_the_model_and_reports_the_full_models_bound(transformer):
    profile, hw = transformer
    budget = int(0.75 * profile.peak_bytes)
    options = RunOptions(time_limit=20, threads=1)
    whole = make_plan(profile, hw, budget, "joint", {"search": False}, options=options)
    fixed = make_plan(profile, hw, budget, "joint", {"fix_above": "1", "search": False}, options=options)
    notes, whole_notes = fixed.plan.planner.notes, whole.plan.planner.notes
    assert "kept" in notes["lp_fixing"] and notes["columns"] < whole_notes["columns"]
    assert fixed.result.ok and fixed.plan.planner.status in ("feasible", "heuristic")
    # the LP bound is a bound on the full model: below its optimum, and the gap is taken against it
    assert notes["model_bound_us"] == pytest.approx(notes["lp_bound_us"])
    assert notes["model_bound_us"] <= whole_notes["model_objective_us"] * (1 + 1e-9)
    assert notes["reduced_model_bound_us"] >= notes["model_bound_us"] * (1 - 1e-9)


def test_a_solve_interrupts_itself_once_past_its_limit(monkeypatch):
    """HiGHS's root cut rounds can outrun its time limit on a busy machine: the solve's
    callbacks interrupt it OVERRUN_S after the limit, or at the last one before when the
    next may come past it, keeping what it has. Here the clock jumps an hour once the solve
    starts, so the first check interrupts a 100 s solve."""
    from planner.shared import highs

    rng = np.random.default_rng(3)
    model = highs.Model()
    n = 40
    first = model.add_vars(n, upper=1.0, cost=0.0, integer=True)
    model.cost[first:first + n] = list(-rng.integers(10, 99, n).astype(float))
    for _ in range(6):
        model.add_row(list(range(first, first + n)), list(rng.integers(1, 60, n).astype(float)), upper=300.0)
    clock = iter(itertools.chain([0.0], itertools.repeat(3600.0)))
    monkeypatch.setattr(highs.time, "perf_counter", lambda: next(clock))
    solution = model.solve(100.0, 1, 0, 0.0)
    assert solution.model_status == "Time limit reached"   # our stop, not HiGHS's "Interrupted by user"
    # callbacks 10 s apart under a 35 s limit: the one at 20 s stops, since the next may come past it
    ticks = itertools.count(0.0, 10.0)
    clock = iter(itertools.chain([0.0, 0.0], ticks))
    monkeypatch.setattr(highs.time, "perf_counter", lambda: next(clock))
    assert model.solve(35.0, 1, 0, 0.0).model_status == "Time limit reached"
    assert next(ticks) == 30.0                             # two callbacks: 10 s (on), 20 s (stop)
    monkeypatch.undo()
    assert model.solve(100.0, 1, 0, 0.0).model_status == "Optimal"   # no interrupt within the limit


def test_the_mip_around_a_relaxation_keeps_its_whole_choices():
    # min -3 x1 - 2 x2, 2 x1 + 2 x2 <= 3, binaries: the optimum is x1 = 1, x2 = 0 (-3). Around
    # the values (0, 0.5) x1 stays 0 and only x2 is free: x2 = 1, -2. The model is as before
    # after (the whole MIP still finds -3).
    from planner.shared.highs import Model
    model = Model()
    first = model.add_vars(2, 0.0, 1.0, integer=True)
    model.cost[first], model.cost[first + 1] = -3.0, -2.0
    model.add_row([first, first + 1], [2.0, 2.0], upper=3.0)
    around = model.around([0.0, 0.5], 10.0, 1, 0, 0.0)
    assert around.status == "optimal" and around.objective == pytest.approx(-2.0)
    assert list(np.round(around.values)) == [0.0, 1.0]
    whole = model.solve(10.0, 1, 0, 0.0)
    assert whole.objective == pytest.approx(-3.0) and list(np.round(whole.values)) == [1.0, 0.0]
