"""The five seed planners: autoswap, layrub, chen-meng, gtbm, cachedarrays. Each one's
defining behaviour on a small graph built for it (the test machine moves 1 byte per
microsecond each way, no latency: a copy of n bytes takes n us), and every one valid on a
synthetic transformer and CNN at 50% of the peak, deterministic for a seed."""
from __future__ import annotations

import sys

import pytest

from planner.swap import autoswap
from planner.core.api import make_plan
from planner.core.registry import get_planner
from simulator.hardware import load_hardware
from simulator.plan import plan_json
from simulator.profile import profile_from_dict
from tests.conftest import profile_dict
from tests.engine_helpers import machine
from tracer.synthetic import synthesize

SEED_PLANNERS = ["autoswap", "layrub", "chen-meng", "gtbm", "cachedarrays"]
SLOW = machine()                      # 1 B/us each way
A100 = load_hardware("a100-40gb-pcie4")


def with_modules(tensors, ops, modules, name="seed"):
    """A profile from compact specs, each op given its ``module`` (op id -> module)."""
    data = profile_dict(tensors, ops, name)
    for op in data["ops"]:
        op["module"] = modules[op["id"]]
    return profile_from_dict(data)


def offloads(plan):
    return {(a.tensor, a.after) for a in plan.actions if a.kind == "offload"}


def prefetches(plan):
    return {(a.tensor, a.after, a.before) for a in plan.actions if a.kind == "prefetch"}


# ----------------------------------------------------------------------------- autoswap

# Every op takes 100 us. Load (bytes) by op: mx 50, my 100, mt 200, ut 201, uy 101, f 51, ux 51.
# The peak is ut (201); at a budget of 160 one of x and y (50 B each) must be away at mt and ut.
#   x: absence mx -> ux: 500 us; DOA = 500 - (50 + 50) = 400, AOA = 20000; WDOA over my..f:
#      (-60 + 40 + 41 - 59 - 109) x 100 = -14700
#   y: absence my -> uy: 200 us; DOA = 100, AOA = 5000; WDOA over mt, ut: (40 + 41) x 100 = 8100
# DOA and AOA rank x first, WDOA ranks y first.
VOTE_TENSORS = {"x": (50, "activation"), "y": (50, "activation"), "t": (100, "activation"), "u": (1, "activation")}
VOTE_OPS = [
    ("mx", "forward", 100.0, [], ["x"]),
    ("my", "forward", 100.0, [], ["y"]),
    ("mt", "forward", 100.0, [], ["t"]),
    ("ut", "forward", 100.0, ["t"], ["u"]),
    ("uy", "backward", 100.0, ["y"], []),
    ("f", "backward", 100.0, [], []),
    ("ux", "backward", 100.0, ["x", "u"], []),
]


def vote_profile():
    return profile_from_dict(profile_dict(VOTE_TENSORS, VOTE_OPS, "vote"))


@pytest.mark.parametrize("weights, chosen", [
    ({}, "x"),                                                    # 0 + 0 + 1 beats 1 + 1 + 0
    ({"w_wdoa": 3.0}, "y"),                                       # 0 + 0 + 3 loses to 1 + 1 + 0
    ({"w_doa": 0.0, "w_aoa": 0.0}, "y"),                          # WDOA alone
])
def test_autoswap_takes_the_candidate_with_the_best_weighted_vote(weights, chosen):
    profile = vote_profile()
    planned = make_plan(profile, SLOW, 160, "autoswap", {"tune_trials": 0, "smallest": 0, **weights})
    assert planned.result.ok
    assert {t for t, _ in offloads(planned.plan)} == {chosen}
    assert planned.plan.planner.notes["swapped"] == 1


def test_autoswap_scores_match_the_paper_formulas():
    model = autoswap.Model(vote_profile(), SLOW, 160, smallest=0)
    cand = model.candidates
    rows = {cand.tensor[i]: (float(cand.doa[i]), float(cand.aoa[i])) for i in range(len(cand))}
    assert rows["x"] == (400.0, 20000.0)
    assert rows["y"] == (100.0, 5000.0)


def test_autoswap_candidates_straddle_the_peak_and_respect_the_smallest_size():
    profile = vote_profile()
    # smallest 51 B: neither x nor y is a candidate, nothing can be swapped, the budget is not met
    planned = make_plan(profile, SLOW, 160, "autoswap", {"tune_trials": 0, "smallest": 51})
    assert planned.result.valid and not planned.result.feasible
    assert planned.plan.planner.status == "infeasible"
    assert not offloads(planned.plan)


# A chain: f0..f3 make a, b, c, d (100 B each) and the backward ops read them in reverse,
# with two 100 us fillers before each; copies take 100 us. At a budget of 250 B, a, b and c
# leave; their swap-ins are serial from the back (each ends before the next one starts).
CHAIN_TENSORS = {"a": (100, "activation"), "b": (100, "activation"), "c": (100, "activation"),
                 "d": (100, "activation")}
CHAIN_OPS = [
    ("f0", "forward", 100.0, [], ["a"]),
    ("f1", "forward", 100.0, ["a"], ["b"]),
    ("f2", "forward", 100.0, ["b"], ["c"]),
    ("f3", "forward", 100.0, ["c"], ["d"]),
    ("g3", "backward", 100.0, ["d"], []),
    ("p2", "backward", 100.0, [], []),
    ("q2", "backward", 100.0, [], []),
    ("g2", "backward", 100.0, ["c"], []),
    ("p1", "backward", 100.0, [], []),
    ("q1", "backward", 100.0, [], []),
    ("g1", "backward", 100.0, ["b"], []),
    ("p0", "backward", 100.0, [], []),
    ("q0", "backward", 100.0, [], []),
    ("g0", "backward", 100.0, ["a"], []),
]


def test_autoswap_stick_to_limit_keeps_swap_outs_and_swap_ins_serial():
    profile = profile_from_dict(profile_dict(CHAIN_TENSORS, CHAIN_OPS, "serial"))
    model = autoswap.Model(profile, SLOW, 250, smallest=0)
    swaps, fitted, _ = autoswap.select(model, (1.0, 1.0, 1.0))
    assert fitted
    swaps, fits = autoswap.stick_to_limit(model, swaps)
    assert fits
    starts = model.starts
    ins = sorted(swaps, key=lambda s: s.c)
    for first, second in zip(ins, ins[1:]):      # each swap-in ends before the next one starts
        assert starts[first.b + 1] + first.in_us <= starts[second.b + 1]
    for swap in swaps:                           # and ends by its use
        assert starts[swap.b + 1] + swap.in_us <= starts[swap.c]
    planned = make_plan(profile, SLOW, 250, "autoswap", {"tune_trials": 0, "smallest": 0})
    assert planned.result.ok
    kinds = [(a.kind, a.after) for a in planned.plan.actions]
    outs = [after for kind, after in kinds if kind == "offload"]
    order = {op.id: i for i, op in enumerate(profile.ops)}
    assert outs == sorted(outs, key=order.__getitem__)          # swap-outs in order of start
    assert planned.plan.planner.estimate_us == pytest.approx(planned.result.iteration_us, rel=0.05)


def test_autoswap_tunes_deterministically_and_falls_back_without_optuna(monkeypatch):
    profile = synthesize("cnn", layers=3, width=32, batch=16, seq=64)
    budget = int(profile.peak_bytes * 0.5)
    first = make_plan(profile, A100, budget, "autoswap", {"tune_trials": 6}, seed=5).plan
    second = make_plan(profile, A100, budget, "autoswap", {"tune_trials": 6}, seed=5).plan
    assert plan_json(first) == plan_json(second)
    method = first.planner.notes["tuning"]["method"]
    try:
        import optuna  # noqa: F401
        assert method.startswith("optuna TPE")
    except ImportError:
        assert method.startswith("seeded random search")
    monkeypatch.setitem(sys.modules, "optuna", None)          # import optuna -> ImportError
    planned = make_plan(profile, A100, budget, "autoswap", {"tune_trials": 6}, seed=5)
    assert planned.plan.planner.notes["tuning"]["method"].startswith("seeded random search")
    assert planned.result.ok
    again = make_plan(profile, A100, budget, "autoswap", {"tune_trials": 6}, seed=5)
    assert plan_json(planned.plan) == plan_json(again.plan)


# ----------------------------------------------------------------------------- layrub

# Layers (module, phase): L1 [f1], L2 [f2, f2b], L3 [f3], loss [loss], loss-bw [bl],
# L3-bw [b3], L2-bw [b2], L1-bw [b1].
LAYER_TENSORS = {"x": (10, "input"), "a": (40, "activation"), "h": (40, "activation"), "o": (40, "activation"),
                 "y": (40, "activation"), "l": (1, "activation"), "dy": (40, "gradient"), "do": (40, "gradient"),
                 "da": (40, "gradient"), "g": (10, "gradient")}
LAYER_OPS = [
    ("f1", "forward", 10.0, ["x"], ["a"]),
    ("f2", "forward", 10.0, ["a"], ["h"]),
    ("f2b", "forward", 10.0, ["h", "a"], ["o"]),      # a's forward reference count reaches zero here
    ("f3", "forward", 10.0, ["o"], ["y"]),
    ("loss", "forward", 10.0, ["y"], ["l"]),
    ("bl", "backward", 10.0, ["l", "y"], ["dy"]),
    ("b3", "backward", 10.0, ["dy", "o"], ["do"]),
    ("b2", "backward", 10.0, ["do", "h", "a"], ["da"]),
    ("b1", "backward", 10.0, ["da", "x"], ["g"]),
]
LAYER_MODULES = {"f1": "L1", "f2": "L2", "f2b": "L2", "f3": "L3", "loss": "loss", "bl": "loss", "b3": "L3",
                 "b2": "L2", "b1": "L1"}


def layer_profile():
    return with_modules(LAYER_TENSORS, LAYER_OPS, LAYER_MODULES, "layers")


def test_layrub_offloads_at_forward_refcount_zero_and_prefetches_one_layer_ahead():
    profile = layer_profile()
    planned = make_plan(profile, SLOW, profile.peak_bytes - 1, "layrub")
    assert planned.result.valid
    # a: last forward read f2b; needed by b2 (layer L2-bw), whose previous layer L3-bw starts at b3
    # h: same; o: last forward read f3, needed by b3, previous layer loss-bw starts at bl
    assert offloads(planned.plan) == {("a", "f2b"), ("h", "f2b"), ("o", "f3")}
    assert prefetches(planned.plan) == {("a", "bl", "b2"), ("h", "bl", "b2"), ("o", "loss", "b3")}
    # y and l are read by the loss layers (forward and the very next, backward): a prefetch one layer
    # ahead could not come after their offload, so they stay
    assert planned.plan.planner.notes["kept_resident"] == 2


def test_layrub_ahead_moves_the_prefetch_one_more_layer_back_and_nothing_moves_when_it_fits():
    profile = layer_profile()
    planned = make_plan(profile, SLOW, profile.peak_bytes - 1, "layrub", {"ahead": 2})
    assert planned.result.valid
    assert ("a", "loss", "b2") in prefetches(planned.plan)
    assert make_plan(profile, SLOW, profile.peak_bytes, "layrub").plan.actions == ()


# ----------------------------------------------------------------------------- chen-meng

# Ops of 50 us. L (100 B) is made by m0 and read by r9: idle from the end of m0 (50 us) to the
# start of r9 (450 us), 400 us. S (100 B) is made by s1 and read by r3: idle 50 us (op 2).
# A swap-in of L (100 us) must start by 350 us: the last op ending by then is p6.
LIFE_TENSORS = {"L": (100, "activation"), "S": (100, "activation")}
LIFE_OPS = [("m0", "forward", 50.0, [], ["L"]), ("s1", "forward", 50.0, [], ["S"]),
            ("p2", "forward", 50.0, [], []), ("r3", "forward", 50.0, ["S"], [])] + \
           [(f"p{i}", "backward", 50.0, [], []) for i in range(4, 9)] + [("r9", "backward", 50.0, ["L"], [])]


def test_chen_meng_swaps_only_life_cycles_above_the_threshold_with_estimated_triggers():
    profile = profile_from_dict(profile_dict(LIFE_TENSORS, LIFE_OPS, "life"))
    planned = make_plan(profile, SLOW, profile.peak_bytes, "chen-meng", {"threshold": 200.0})
    assert planned.result.ok
    assert offloads(planned.plan) == {("L", "m0")}
    assert prefetches(planned.plan) == {("L", "p6", "r9")}
    assert planned.result.stall_us == 0                        # the copy is hidden
    low = make_plan(profile, SLOW, profile.peak_bytes, "chen-meng", {"threshold": 10.0})
    assert {t for t, _ in offloads(low.plan)} == {"L", "S"}     # S's 50 us life-cycle too


def test_chen_meng_searches_the_threshold_by_simulation():
    profile = profile_from_dict(profile_dict(LIFE_TENSORS, LIFE_OPS, "life"))
    # 150 B: at r3 (L and S live) L must be away; S need not be
    planned = make_plan(profile, SLOW, 150, "chen-meng")
    assert planned.result.ok
    assert offloads(planned.plan) == {("L", "m0")}
    notes = planned.plan.planner.notes
    assert notes["swapped"] == 1 and notes["threshold_us"] == 50.0 and notes["tried"]
    assert make_plan(profile, SLOW, profile.peak_bytes, "chen-meng").plan.actions == ()


# ----------------------------------------------------------------------------- gtbm

# Backward conv layers (names with a word starting "conv"): conv_bw4, conv_bw3, conv_bw2,
# conv_bw1, with a non-convolution layer act_bw between the first two.
CONV_TENSORS = {"x": (10, "input"), "a1": (40, "activation"), "a2": (40, "activation"), "a3": (40, "activation"),
                "a4": (40, "activation"), "l": (1, "activation"), "g4": (40, "gradient"), "gh": (40, "gradient"),
                "g3": (40, "gradient"), "g2": (40, "gradient"), "g1": (40, "gradient"), "gx": (10, "gradient")}
CONV_OPS = [
    ("conv_f1", "forward", 10.0, ["x"], ["a1"]),
    ("conv_f2", "forward", 10.0, ["a1"], ["a2"]),
    ("conv_f3", "forward", 10.0, ["a2"], ["a3"]),
    ("conv_f4", "forward", 10.0, ["a3"], ["a4"]),
    ("loss", "forward", 10.0, ["a4"], ["l"]),
    ("loss_bw", "backward", 10.0, ["l"], ["g4"]),
    ("conv_bw4", "backward", 10.0, ["g4", "a3"], ["gh"]),
    ("act_bw", "backward", 10.0, ["gh"], ["g3"]),
    ("conv_bw3", "backward", 10.0, ["g3", "a2"], ["g2"]),
    ("conv_bw2", "backward", 10.0, ["g2", "a1"], ["g1"]),
    ("conv_bw1", "backward", 10.0, ["g1", "x"], ["gx"]),
]
CONV_MODULES = {"conv_f1": "c1", "conv_f2": "c2", "conv_f3": "c3", "conv_f4": "c4", "loss": "loss",
                "loss_bw": "loss", "conv_bw4": "c4", "act_bw": "act", "conv_bw3": "c3", "conv_bw2": "c2",
                "conv_bw1": "c1"}


def test_gtbm_prefetches_no_earlier_than_two_conv_layers_ahead():
    profile = with_modules(CONV_TENSORS, CONV_OPS, CONV_MODULES, "convs")
    planned = make_plan(profile, SLOW, profile.peak_bytes - 1, "gtbm")
    assert planned.result.valid
    assert planned.plan.planner.notes["paced_by"] == "convolution"
    assert offloads(planned.plan) == {("a1", "conv_f2"), ("a2", "conv_f3"), ("a3", "conv_f4")}
    # a1 is needed by conv_bw2; the conv layers before it are conv_bw4 and conv_bw3 (act_bw does not
    # count): issued as conv_bw4 starts. a2 (conv_bw3) has one conv layer before it: as backward starts.
    assert prefetches(planned.plan) == {("a1", "loss_bw", "conv_bw2"), ("a2", "loss", "conv_bw3"),
                                        ("a3", "loss", "conv_bw4")}
    order = {op.id: i for i, op in enumerate(profile.ops)}
    conv_starts = [order[o] for o in ("conv_bw4", "conv_bw3", "conv_bw2", "conv_bw1")]
    for _, after, before in prefetches(planned.plan):
        assert sum(order[after] < s < order[before] for s in conv_starts) <= 2
    one = make_plan(profile, SLOW, profile.peak_bytes - 1, "gtbm", {"conv_ahead": 1})
    assert ("a1", "act_bw", "conv_bw2") in prefetches(one.plan)


def test_gtbm_paces_by_fully_connected_layers_without_convolutions():
    profile = SYNTHETIC["transformer"]
    planned = make_plan(profile, A100, int(profile.peak_bytes * 0.5), "gtbm")
    assert planned.result.valid
    assert planned.plan.planner.notes["paced_by"].startswith("fully connected")


# ----------------------------------------------------------------------------- cachedarrays

# Ops of 10 us. far (100 B): made by m0, next used by u7 (distance 6 ops); near (100 B): made
# by m1, next used by u4 (distance 2).
HINT_TENSORS = {"far": (100, "activation"), "near": (100, "activation")}
HINT_OPS = [("m0", "forward", 10.0, [], ["far"]), ("m1", "forward", 10.0, [], ["near"]),
            ("p2", "forward", 10.0, [], []), ("p3", "forward", 10.0, [], []),
            ("u4", "backward", 10.0, ["near"], []), ("p5", "backward", 10.0, [], []),
            ("p6", "backward", 10.0, [], []), ("u7", "backward", 10.0, ["far"], [])]


def test_cachedarrays_offloads_only_tensors_whose_next_use_is_far():
    profile = profile_from_dict(profile_dict(HINT_TENSORS, HINT_OPS, "hints"))
    planned = make_plan(profile, SLOW, profile.peak_bytes, "cachedarrays", {"distance": 3, "ahead": 2})
    assert planned.result.valid
    assert offloads(planned.plan) == {("far", "m0")}
    assert prefetches(planned.plan) == {("far", "u4", "u7")}   # 2 ops (p5, p6) of lead
    both = make_plan(profile, SLOW, profile.peak_bytes, "cachedarrays", {"distance": 1, "ahead": 0})
    assert offloads(both.plan) == {("far", "m0"), ("near", "m1")}
    assert ("far", "p6", "u7") in prefetches(both.plan)                           # ahead 0: just before


def test_cachedarrays_lowers_the_distance_only_as_far_as_the_budget_needs():
    profile = profile_from_dict(profile_dict(HINT_TENSORS, HINT_OPS, "hints"))
    # 100 B: at most one of far and near on the GPU at p2 and p3: far (the farther) goes
    planned = make_plan(profile, SLOW, 100, "cachedarrays", {"ahead": 1})
    assert planned.result.ok
    assert offloads(planned.plan) == {("far", "m0")}
    assert planned.plan.planner.notes["distance"] == 2


# ----------------------------------------------------------------------------- all five


def _synthetic():
    return {"transformer": synthesize("transformer", layers=12, batch=16, seq=1024),
            "cnn": synthesize("cnn", layers=4, width=32, batch=16, seq=64)}


SYNTHETIC = _synthetic()


@pytest.mark.parametrize("model", sorted(SYNTHETIC))
@pytest.mark.parametrize("planner", SEED_PLANNERS)
def test_every_seed_planner_is_valid_on_synthetic_models_at_half_the_peak(planner, model):
    profile = SYNTHETIC[model]
    budget = int(profile.peak_bytes * 0.5)
    planned = make_plan(profile, A100, budget, planner, seed=1)
    assert planned.result.valid, (planned.result.rule, planned.result.reason)
    assert planned.plan.planner.status in (("heuristic", "fallback") if planned.result.feasible else ("infeasible",))
    again = make_plan(profile, A100, budget, planner, seed=1)
    assert plan_json(planned.plan) == plan_json(again.plan)


@pytest.mark.parametrize("planner", SEED_PLANNERS)
def test_each_seed_planner_names_its_paper_and_documents_its_departures(planner):
    spec = get_planner(planner)
    doc = sys.modules[spec.func.__module__].__doc__
    assert spec.paper and "What it does" in doc and "Departures from the paper" in doc
    assert all(p.help for p in spec.params)
