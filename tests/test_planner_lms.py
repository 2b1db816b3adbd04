"""lms: topological levels, the swap-out threshold, swap-in control ops and grouping, the
auto-tuner, and the sweep over the shipped profiles."""
from __future__ import annotations

import pytest

from planner.core.api import make_plan
from planner.swap.lms import Knobs, lms_actions, plan_lms, topological_levels
from simulator.catalog import open_profile
from simulator.api import simulate
from simulator.hardware import load_hardware
from simulator.plan import Plan
from tests.conftest import make_profile
from tests.engine_helpers import machine

FAST_MACHINE = machine(h2d=1.0, d2h=1.0)   # 1000 bytes per microsecond each way

# A four-layer chain. x is a persistent input, so f1 has no predecessor. Positions and
# levels coincide: f1 0, f2 1, f3 2, f4 3, loss 4, b4 5, b3 6, b2 7, b1 8.
# Level distance producer -> farthest consumer:
#   a1: f1 (0) -> b1 (8) = 8   a2: f2 (1) -> b2 (7) = 6   a3: f3 (2) -> b3 (6) = 4
#   a4: f4 (3) -> b4 (5) = 2   l, g4, g3, g2: 1
CHAIN_TENSORS = {
    "x": (10, "input"),
    "a1": (100, "activation"), "a2": (100, "activation"), "a3": (100, "activation"), "a4": (100, "activation"),
    "l": (1, "activation"),
    "g4": (10, "gradient"), "g3": (10, "gradient"), "g2": (10, "gradient"), "g1": (10, "gradient"),
}
CHAIN_OPS = [
    ("f1", "forward", 10.0, ["x"], ["a1"]),
    ("f2", "forward", 10.0, ["a1"], ["a2"]),
    ("f3", "forward", 10.0, ["a2"], ["a3"]),
    ("f4", "forward", 10.0, ["a3"], ["a4"]),
    ("loss", "forward", 10.0, ["a4"], ["l"]),
    ("b4", "backward", 10.0, ["l", "a4"], ["g4"]),
    ("b3", "backward", 10.0, ["g4", "a3"], ["g3"]),
    ("b2", "backward", 10.0, ["g3", "a2"], ["g2"]),
    ("b1", "backward", 10.0, ["g2", "a1"], ["g1"]),
]


@pytest.fixture
def chain():
    return make_profile(CHAIN_TENSORS, CHAIN_OPS, "lms-chain")


def run(profile, actions, budget=10**6, hardware=FAST_MACHINE):
    result = simulate(profile, Plan(profile.name, tuple(actions)), hardware, budget)
    assert result.valid, f"{result.rule}: {result.reason}"
    return result


def given(profile, threshold, ahead=1, groupby=0, budget=10**6):
    return plan_lms(profile, FAST_MACHINE, budget, swapout_threshold=threshold,
                    swapin_ahead=ahead, swapin_groupby=groupby)


def swapped(actions):
    return sorted(a.tensor for a in actions if a.kind == "offload")


def test_levels_are_longest_paths_from_a_source():
    # d reads a (level 1) and c (level 2): it sits at level 3, not 2.
    profile = make_profile(
        {"x": (1, "input"), "a": (1, "activation"), "b": (1, "activation"), "c": (1, "activation"),
         "d": (1, "activation")},
        [("p", "forward", 1.0, ["x"], ["a"]), ("q", "forward", 1.0, ["a"], ["b"]),
         ("r", "forward", 1.0, ["b"], ["c"]), ("s", "forward", 1.0, ["a", "c"], ["d"])])
    assert topological_levels(profile).level == [0, 1, 2, 3]


@pytest.mark.parametrize("threshold, expected", [
    (2, ["a1", "a2", "a3"]),      # a4's distance 2 is at the threshold: kept
    (4, ["a1", "a2"]),            # a3's distance 4 is at the threshold: kept
    (5, ["a1", "a2"]),
    (6, ["a1"]),
    (8, []),
])
def test_never_swaps_a_tensor_at_or_below_its_threshold(chain, threshold, expected):
    actions = given(chain, threshold).actions
    assert swapped(actions) == expected
    run(chain, actions)


def test_every_swap_on_a_shipped_profile_serves_a_far_consumer():
    profile = open_profile("synth-transformer-l12-b16-s1024")
    levels = topological_levels(profile)
    for threshold in (1, 5, 20, 60):
        actions = lms_actions(profile, levels, Knobs(threshold, 1, 0))
        for action in actions:
            start = levels.level[profile.producer[action.tensor]]
            if action.kind == "offload":
                assert any(levels.level[c] - start > threshold for c in profile.consumers[action.tensor])
            if action.kind == "prefetch":
                assert levels.level[profile.op_index[action.before]] - start > threshold


def test_swap_out_follows_the_producer_and_swap_in_fires_ahead_levels_early(chain):
    # a1 (made by f1) is needed by b1 at level 8. With ahead 1 the control op is at the
    # highest level below 8 - 1 = 7 that reaches b1: b3 (level 6). With ahead 3: b1's
    # level 8 - 3 = 5, so level 4: the loss op.
    actions = given(chain, 6, ahead=1).actions
    assert [(a.kind, a.after, a.before) for a in actions] == [("offload", "f1", None), ("prefetch", "b3", "b1")]
    actions = given(chain, 6, ahead=3).actions
    assert [(a.kind, a.after, a.before) for a in actions] == [("offload", "f1", None), ("prefetch", "loss", "b1")]
    run(chain, actions)


def test_swap_in_is_synchronous_when_no_control_op_is_in_reach(chain):
    # a2 is made at level 1 and needed by b2 at level 7. With ahead 6 the search range
    # is levels [max(7 - 6 - 10, 1 + 1), 7 - 6) = [2, 1): empty. So the swap-in is issued
    # after the op just before b2, which is b3.
    actions = given(chain, 5, ahead=6).actions
    fetch = [a for a in actions if a.kind == "prefetch" and a.tensor == "a2"]
    assert [(a.after, a.before) for a in fetch] == [("b3", "b2")]
    run(chain, actions)


def test_a_far_consumer_right_after_the_previous_use_keeps_the_tensor(chain):
    # Threshold 1 makes a4 far (distance 2), but b4 (level 5) has no control op in
    # [max(5 - 1 - 10, 3 + 1), 5 - 1) = [4, 4): the swap-in would be synchronous, issued
    # after the loss op, which itself reads a4. So a4 is not swapped at all.
    actions = given(chain, 1).actions
    assert swapped(actions) == ["a1", "a2", "a3"]
    run(chain, actions)


# One activation a with a near consumer and two far ones three levels apart:
#   f (level 0) makes a; g reads a (1); loss (2); k (3); b1 reads a (4); m1 (5); m2 (6);
#   b2 reads a (7). Positions equal levels.
GROUP_TENSORS = {"x": (10, "input"), "a": (100, "activation"), "h": (10, "activation"), "l": (1, "activation"),
                 "q": (10, "activation"), "g1": (10, "gradient"), "g2": (10, "gradient"),
                 "g3": (10, "gradient"), "g4": (10, "gradient")}
GROUP_OPS = [
    ("f", "forward", 10.0, ["x"], ["a"]),
    ("g", "forward", 10.0, ["a"], ["h"]),
    ("loss", "forward", 10.0, ["h"], ["l"]),
    ("k", "backward", 10.0, ["l"], ["q"]),
    ("b1", "backward", 10.0, ["q", "a"], ["g1"]),
    ("m1", "backward", 10.0, ["g1"], ["g2"]),
    ("m2", "backward", 10.0, ["g2"], ["g3"]),
    ("b2", "backward", 10.0, ["g3", "a"], ["g4"]),
]


def test_groupby_shares_one_swap_in_between_consumers_within_it():
    profile = make_profile(GROUP_TENSORS, GROUP_OPS, "groupby")
    # groupby 0: b1 and b2 each get a swap-in. b1's control op is at level 4 - 1 - 1 = 2
    # (loss); then a is dropped after b1 and brought back after m1 (level 7 - 1 - 1 = 5).
    # g (distance 1) reads a inside the offload's window.
    separate = given(profile, 1, ahead=1, groupby=0).actions
    assert [(a.kind, a.after, a.before) for a in separate] == [
        ("offload", "f", None), ("prefetch", "loss", "b1"), ("drop", "b1", None), ("prefetch", "m1", "b2")]
    run(profile, separate)
    # groupby 3: b1 (level 4) and b2 (level 7) are within 3 levels: one swap-in, before b1.
    shared = given(profile, 1, ahead=1, groupby=3).actions
    assert [(a.kind, a.after, a.before) for a in shared] == [("offload", "f", None), ("prefetch", "loss", "b1")]
    run(profile, shared)
    # groupby 2 is not enough.
    assert sum(a.kind == "prefetch" for a in given(profile, 1, ahead=1, groupby=2).actions) == 2


def test_a_group_whose_swap_in_would_fire_before_the_previous_use_stays_resident():
    profile = make_profile(GROUP_TENSORS, GROUP_OPS, "groupby")
    # ahead 3: b2's control op would be at level 7 - 3 - 1 = 3, op k, which runs before
    # b1 reads a: a stays on the GPU from b1 to b2 (no drop, no second swap-in). b1's
    # range [max(4 - 3 - 10, 0 + 1), 4 - 3) is empty: synchronous, after k.
    actions = given(profile, 1, ahead=3, groupby=0).actions
    assert [(a.kind, a.after, a.before) for a in actions] == [("offload", "f", None), ("prefetch", "k", "b1")]
    run(profile, actions)


# Auto-tune on the chain (fast links, so copies never stall). The no-swap peak is at b4:
# x 10 + a1..a4 400 + l 1 + g4 10 = 421. With ahead 1 (the threshold search's), thresholds
# 1..5 swap a1 and a2 (and a3 up to 3, but it is back by b4, fetched after the loss op),
# 6 and 7 only a1, 8 and 9 nothing.
#   a1 and a2 away: at b4  x + a3 + a4 + l + g4 = 221 (a2 returns after b4, a1 after b3)
#   a1 away:        at b4  221 + a2 100 = 321
# Budget 250: 5 is the largest fitting threshold; the binary search over [1, 9 levels]
# tries 5 (fits), 7 (no), 6 (no). Budget 330: 7; it tries 5, 7 (fits), 8 (no).
@pytest.mark.parametrize("budget, threshold, moved", [(250, 5, ["a1", "a2"]), (330, 7, ["a1"])])
def test_autotune_finds_the_largest_threshold_that_fits(chain, budget, threshold, moved):
    assert chain.peak_bytes == 421
    draft = plan_lms(chain, FAST_MACHINE, budget)
    assert draft.notes["swapout_threshold"] == threshold
    assert swapped(draft.actions) == moved
    result = run(chain, draft.actions, budget)
    assert result.feasible and result.peak_bytes <= budget
    assert not run(chain, given(chain, threshold + 1, ahead=draft.notes["swapin_ahead"]).actions, budget).feasible


def test_autotune_swaps_nothing_when_the_no_swap_peak_fits(chain):
    draft = plan_lms(chain, FAST_MACHINE, chain.peak_bytes)
    assert draft.actions == []
    assert draft.notes["search"] == "no swapping needed"


def test_autotune_tunes_groupby_when_asked(chain):
    draft = plan_lms(chain, FAST_MACHINE, 250, swapin_groupby=-1)
    # Each swapped chain tensor has one far consumer, so every groupby gives the same plan:
    # the first candidate, the number of levels, fits and is taken (TFLMS's search).
    assert draft.notes["swapin_groupby"] == draft.notes["levels"] == 9
    assert draft.actions == plan_lms(chain, FAST_MACHINE, 250).actions   # as groupby 0
    assert run(chain, draft.actions, 250).feasible


def test_autotune_off_uses_threshold_1(chain):
    draft = plan_lms(chain, FAST_MACHINE, 250, autotune=False)
    assert (draft.notes["swapout_threshold"], draft.notes["swapin_ahead"]) == (1, 1)
    assert swapped(draft.actions) == ["a1", "a2", "a3"]   # a4: see the test above


# ----------------------------------------------------------------------------- shipped profiles

PROFILES = ["synth-transformer-l12-b16-s1024", "synth-cnn-l16-w128-b64-s224", "synth-mlp-l16-w8192-b1024"]
HW = load_hardware("a100-40gb-pcie4")


def test_shipped_transformer_fits_at_half_the_peak():
    profile = open_profile("synth-transformer-l12-b16-s1024")
    planned = make_plan(profile, HW, int(profile.peak_bytes * 0.5), "lms")
    assert planned.result.ok
    assert planned.result.overhead < 0.1
