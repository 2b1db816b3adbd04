"""checkmate: the rematerialization MILP on hand-made graphs, checked against brute force
and the simulator; coarsening, R15, the fallback to chen and determinism."""
from __future__ import annotations

import itertools

import pytest

from planner.core.api import make_plan, score
from planner.shared.checkpoint import droppable, recompute_plan, segment_of
from planner.core.registry import RunOptions
from planner.recompute.checkmate import Formulation, build_graph, group, lower, recomputable
from planner.recompute.chen import plan_chen
from simulator.api import Simulator
from simulator.catalog import open_profile
from simulator.hardware import load_hardware
from simulator.plan import plan_json
from tests.conftest import make_profile
from tests.engine_helpers import machine

QUICK = RunOptions(threads=1, time_limit=30)
HW = machine()

# A chain: f_k makes a_k from a_(k-1) (a_0 is the input x); b_k, the backward of f_k, reads
# the gradient from above and a_(k-1). No-swap memory peaks at 511 bytes at f_a6.
SIZES = {"a1": 100, "a2": 60, "a3": 120, "a4": 80, "a5": 50, "a6": 90}
TIMES = {"a1": 7.0, "a2": 3.0, "a3": 11.0, "a4": 2.0, "a5": 5.0, "a6": 13.0}


def chain(sizes=SIZES, times=TIMES, name="cm-chain"):
    tensors = {"x": (10, "input"), **{k: (v, "activation") for k, v in sizes.items()}, "l": (1, "activation")}
    names = list(sizes)
    ops, prev = [], "x"
    for k in names:
        ops.append((f"f_{k}", "forward", times[k], [prev], [k]))
        prev = k
    ops.append(("loss", "forward", 1.0, [prev], ["l"]))
    grad = "l"
    for idx in range(len(names) - 1, -1, -1):
        out = f"g{idx}"
        tensors[out] = (5, "gradient")
        ops.append((f"b_{names[idx]}", "backward", 10.0, [grad, names[idx - 1] if idx else "x"], [out]))
        grad = out
    return make_profile(tensors, ops, name)


def brute_force(profile, budget):
    """Every subset of the droppable activations, each dropped after its last forward use
    and recomputed once before backward needs it (chen's lazy lowering), simulated: the
    best time and the subsets that reach it."""
    cands = sorted(droppable(profile, segment_of(profile, 1)))
    found = []
    for k in range(len(cands) + 1):
        for subset in itertools.combinations(cands, k):
            result = score(Simulator(profile, HW), budget, recompute_plan(profile, {t: 0 for t in subset}, lazy=True))
            if result.ok:
                found.append((result.iteration_us, set(subset)))
    if not found:
        return None, []
    best = min(t for t, _ in found)
    return best, [s for t, s in found if t == best]


def recomputed(planned) -> list[str]:
    return [a.tensor for a in planned.plan.actions if a.kind == "recompute"]


@pytest.mark.parametrize("budget", [501, 421, 361, 321, 281])
def test_the_milp_finds_the_brute_force_optimum_and_its_estimate_is_the_simulated_time(budget):
    profile = chain()
    best, winners = brute_force(profile, budget)
    assert best is not None and best > profile.ideal_us        # every one of these budgets needs recomputing
    planned = make_plan(profile, HW, budget, "checkmate", options=QUICK)
    assert planned.result.ok and planned.result.peak_bytes <= budget
    assert planned.plan.planner.status == "optimal"
    assert planned.result.iteration_us == pytest.approx(best)
    assert set(recomputed(planned)) in winners
    assert planned.plan.planner.estimate_us == pytest.approx(planned.result.iteration_us)


def test_recomputing_a_tensor_twice_fits_where_no_single_recompute_plan_does():
    # at 261 bytes no subset recomputed once fits; Checkmate's stages let a1 come back twice
    # (for a2's recompute at b_a5, dropped, then again for b_a3 and b_a2): 102 + 2*7 + 3 + 11 us
    profile = chain()
    assert brute_force(profile, 261) == (None, [])
    planned = make_plan(profile, HW, 261, "checkmate", options=QUICK)
    assert planned.result.ok and planned.result.peak_bytes <= 261
    assert planned.plan.planner.status == "optimal"
    assert sorted(recomputed(planned)) == ["a1", "a1", "a2", "a3"]
    assert planned.result.iteration_us == pytest.approx(130.0)


def test_a_budget_no_plan_of_the_model_meets_falls_back_to_chen_and_says_why():
    profile = chain()
    planned = make_plan(profile, HW, 251, "checkmate", options=QUICK)
    notes = planned.plan.planner.notes
    assert "no plan within the model fits" in notes["fallback"] and notes["solver"] == "Infeasible"
    assert planned.plan.actions == tuple(plan_chen(profile, HW, 251).actions)
    assert planned.plan.planner.status == "infeasible"        # chen cannot meet it either: the simulator says so


@pytest.mark.parametrize("limit", [1e-9, 1e-3])
def test_an_impossible_time_limit_falls_back_to_chen_and_marks_it(limit):
    profile = long_chain()
    budget = int(0.45 * profile.peak_bytes)
    planned = make_plan(profile, HW, budget, "checkmate", options=RunOptions(threads=1, time_limit=limit))
    assert planned.plan.planner.status == "fallback"
    assert "in time" in planned.plan.planner.notes["fallback"] or "time limit" in planned.plan.planner.notes["fallback"]
    assert planned.plan.actions == tuple(plan_chen(profile, HW, budget).actions)
    assert planned.result.ok                                   # chen fits here: the fallback keeps a plan


def long_chain(layers=24):
    sizes = {f"a{k}": 40 + (37 * k) % 90 for k in range(1, layers + 1)}
    times = {f"a{k}": 1.0 + (13 * k) % 11 for k in range(1, layers + 1)}
    return chain(sizes, times, f"cm-chain{layers}")


def test_coarsening_groups_consecutive_tensors_and_keeps_a_valid_plan_that_fits():
    profile = long_chain()
    budget = int(0.45 * profile.peak_bytes)
    graph = build_graph(profile, budget)
    coarse = group(graph, 8)
    assert len(coarse.nodes) == 8 < len(graph.items)
    assert [t for node in coarse.nodes for t in node] == graph.order       # runs, in producer order, cover all
    fine = make_plan(profile, HW, budget, "checkmate", options=QUICK)
    planned = make_plan(profile, HW, budget, "checkmate", {"nodes": 8}, options=QUICK)
    assert planned.plan.planner.notes["nodes"] == 8 and fine.plan.planner.notes["nodes"] == len(graph.items)
    for run in (planned, fine):
        assert run.result.valid and run.result.ok and run.result.peak_bytes <= budget
        assert run.plan.planner.status == "optimal"
        assert run.plan.planner.estimate_us == pytest.approx(run.result.iteration_us)
    # a coarse plan is one the fine model can express: the fine optimum is no worse
    assert fine.result.iteration_us < planned.result.iteration_us


def test_a_plan_slower_than_chens_is_replaced_by_chens_and_marked():
    # six nodes for 25 tensors: the coarse model's best plan is slower than chen's
    profile = long_chain()
    budget = int(0.45 * profile.peak_bytes)
    planned = make_plan(profile, HW, budget, "checkmate", {"nodes": 6}, options=QUICK)
    notes = planned.plan.planner.notes
    assert planned.plan.planner.status == "fallback" and "simulated faster" in notes["fallback"]
    assert planned.plan.actions == tuple(plan_chen(profile, HW, budget).actions)
    assert planned.result.ok and planned.result.iteration_us == notes["chen_us"] < notes["simulated_us"]


def test_the_same_inputs_give_the_same_plan():
    profile = long_chain()
    budget = int(0.45 * profile.peak_bytes)
    first = make_plan(profile, HW, budget, "checkmate", {"nodes": 8}, seed=5, options=RunOptions(seed=5, threads=1))
    second = make_plan(profile, HW, budget, "checkmate", {"nodes": 8}, seed=5, options=RunOptions(seed=5, threads=1))
    assert first.plan.planner.status == "optimal" and recomputed(first)
    assert plan_json(first.plan) == plan_json(second.plan)


def inplace_profile():
    # ResNet's pattern: c1 = conv(x); b1 = bn(c1), which updates its running stats in place;
    # relu_(b1) in place; c2 = conv(b1); s = scale(c2), which updates a counter in place (so s cannot
    # be recomputed) and which backward never reads: m = mid(s) can be recomputed only while s lives.
    tensors = {"x": (10, "input"), "w": (10, "weight"), "rs": (10, "weight"), "n": (1, "weight"),
               "c1": (100, "activation"), "b1": (100, "activation"), "c2": (100, "activation"),
               "s": (100, "activation"), "m": (100, "activation"), "l": (1, "activation"),
               "g3": (1, "gradient"), "g2": (1, "gradient"), "g1": (1, "gradient"), "g0": (1, "gradient")}
    ops = [("conv1", "forward", 10.0, ["x", "w"], ["c1"]),
           ("bn", "forward", 5.0, ["c1"], ["b1"], ["rs"]),
           ("relu_", "forward", 1.0, [], [], ["b1"]),
           ("conv2", "forward", 10.0, ["b1", "w"], ["c2"]),
           ("scale", "forward", 2.0, ["c2"], ["s"], ["n"]),
           ("mid", "forward", 2.0, ["s"], ["m"]),
           ("loss", "forward", 1.0, ["m"], ["l"]),
           ("mid_bw", "backward", 3.0, ["l", "m"], ["g3"]),
           ("conv2_bw", "backward", 10.0, ["g3", "c2", "b1"], ["g2"]),
           ("bn_bw", "backward", 5.0, ["g2", "c1", "b1"], ["g1"]),
           ("conv1_bw", "backward", 10.0, ["g1", "x"], ["g0"])]
    return make_profile(tensors, ops, "cm-inplace")


def test_r15_decides_what_may_be_recomputed_and_the_plan_is_valid():
    profile = inplace_profile()
    items, _ = recomputable(profile)
    # b1: its producer updates in place, and relu_ updates it; s: its producer updates n in place;
    # m: its source s is dead by backward; c2 is fine (b1 was updated in place before conv2 read it,
    # and lives until bn_bw); l is made from m, which is kept
    assert set(items) == {"c1", "c2", "l"}
    budget = 440
    assert not make_plan(profile, HW, budget, "none").result.ok
    planned = make_plan(profile, HW, budget, "checkmate", options=QUICK)
    assert planned.result.valid and planned.result.ok and planned.result.peak_bytes <= budget
    assert planned.plan.planner.status == "optimal"
    assert set(recomputed(planned)) <= {"c1", "c2"} and recomputed(planned)


def test_the_lowering_refuses_a_tensor_read_while_dropped_and_lowers_single_recomputes():
    profile = chain()
    graph = group(build_graph(profile, 321), 100)
    with pytest.raises(ValueError, match="neither kept nor recomputed"):
        lower(graph, keep={}, redo={})                         # everything dropped, nothing recomputed
    assert lower(graph, keep={(t, i): True for i in range(len(graph.nodes)) for t in range(1, graph.stages)},
                 redo={}) == []                                # everything kept: nothing to do
    # each node dropped after the forward pass and recomputed once, where it is first needed
    actions = lower(graph, *Formulation(graph, 321).first_need())
    drops = [a.tensor for a in actions if a.kind == "drop"]
    assert sorted(drops) == sorted(recomputed_ids := [a.tensor for a in actions if a.kind == "recompute"])
    assert len(set(recomputed_ids)) == len(recomputed_ids) == 5      # a1..a5 (l and a6 are kept: no gain)
    result = score(Simulator(profile, HW), profile.peak_bytes, actions)
    assert result.ok and result.recomputes == 5


def test_resnet50_at_40_gib_fits_with_the_solvers_own_plan_and_beats_chen():
    profile, hw = open_profile("resnet50-b1024-s224"), load_hardware("a100-40gb-pcie4")
    budget = 40 * 2**30
    planned = make_plan(profile, hw, budget, "checkmate", options=RunOptions(threads=1, time_limit=60))
    assert planned.plan.planner.status == "optimal" and "fallback" not in planned.plan.planner.notes
    assert planned.result.ok and planned.result.peak_bytes <= budget
    chen = make_plan(profile, hw, budget, "chen")
    assert planned.result.iteration_us < chen.result.iteration_us
