"""Op variants (R52) and grouped transfers (R53), hand-computed, and the planner core's
``group`` option.

The toy: p (1 us) makes a and b (1,000,000 B each); x runs 1,000 us with a 4,096-byte
workspace, or 1,500 us with none as its variant ``small``; c (1 us) reads a and b. PCIe
moves 10,000 B/us each way after a 10 us latency.
"""
from __future__ import annotations

import pytest

from planner.core.api import make_plan
from planner.shared.grouping import group_actions
from simulator.api import Simulator
from simulator.errors import InputError
from simulator.hardware import hardware_from_dict
from simulator.plan import Plan, drop, load_plan, offload, plan_json, prefetch, recompute
from simulator.profile import profile_from_dict
from tests.conftest import profile_dict

HW = {"name": "group-toy", "gpu": {"memory": "1GiB", "fp32_tflops": 19.5, "fp16_tflops": 312, "hbm_gbps": 1555},
      "pcie": {"h2d_gbps": 10, "d2h_gbps": 10, "duplex": "full", "latency_us": 10}, "host": {"memory": "1GiB"}}


def toy(variants=({"name": "small", "time_us": 1500, "workspace_bytes": 0},)):
    data = profile_dict({"a": (1_000_000, "activation"), "b": (1_000_000, "activation"), "z": (1, "activation"),
                         "y": (1, "activation")},
                        [("p", "forward", 1.0, [], ["a", "b"]), ("x", "forward", 1000.0, [], ["z"], None, 4096),
                         ("c", "backward", 1.0, ["a", "b"], ["y"])], "group-toy")
    data["ops"][1]["variants"] = list(variants)
    return profile_from_dict(data)


def run(profile, *actions, budget=None, **kw):
    return Simulator(profile, hardware_from_dict(HW)).simulate(Plan(profile.name, tuple(actions), **kw), budget)


SWAPS = (offload("a", "p"), offload("b", "p"), prefetch("a", "x", "c"), prefetch("b", "x", "c"))


def grouped(*actions, ids=("g1", "g1", "g2", "g2")):
    from dataclasses import replace
    return tuple(replace(a, group=g) for a, g in zip(actions, ids))


def test_two_prefetches_pay_two_latencies_a_group_one():
    plain = run(toy(), *SWAPS)
    # offloads 1-111 and 111-221; prefetches after x (1001): 1001-1111, 1111-1221; c 1221-1222
    assert plain.iteration_us == 1222.0 and plain.transfers == 4
    both = run(toy(), *grouped(*SWAPS))
    # one latency, one flow of 2,000,000 B: 1001-1211; c 1211-1212
    assert both.iteration_us == 1212.0 and both.bytes_h2d == plain.bytes_h2d == 2_000_000
    assert both.busy_us["h2d"] == 210.0 and plain.busy_us["h2d"] == 220.0


def test_group_timeline_lists_members():
    profile = toy()
    r = Simulator(profile, hardware_from_dict(HW)).simulate(Plan(profile.name, grouped(*SWAPS)), record=True)
    spans = [s for s in r.timeline.spans if s.track == "h2d"]
    assert len(spans) == 1 and spans[0].args["members"] == ["a", "b"] and spans[0].name.startswith("prefetch group g2")
    assert (spans[0].start_us, spans[0].end_us) == (1001.0, 1211.0)


def test_a_group_member_holds_its_copy_until_the_group_ends():
    # grouped offloads: a and b leave the GPU together at 211 (one latency, 2,000,000 B); x's
    # workspace (4,096 B) and output z (1 B) stay
    profile = toy()
    sim = Simulator(profile, hardware_from_dict(HW))
    r = sim.simulate(Plan(profile.name, grouped(*SWAPS)), record=True)
    memory = dict(r.timeline.memory)
    assert memory[211.0] == 4097 and max(b for t, b in r.timeline.memory if t < 211.0) == 2_004_097


@pytest.mark.parametrize("actions, words", [
    ((offload("a", "p"), offload("b", "x"), prefetch("a", "x", "c"), prefetch("b", "x", "c")),
     "issued after another op"),
    ((offload("a", "p"), offload("b", "p"), prefetch("a", "x", "c"), prefetch("b", "p", "x")),
     "issued after another op"),
])
def test_invalid_groups(actions, words):
    r = run(toy(), *grouped(*actions, ids=("g1", "g1", "g2", "g2")))
    assert not r.valid and r.rule == "R53" and words in r.reason


def test_group_members_keep_their_own_rules():
    # b's prefetch is grouped with a's, but b was never offloaded: R12 is b's own
    r = run(toy(), *grouped(offload("a", "p"), prefetch("a", "x", "c"), prefetch("b", "x", "c"),
                            ids=("g1", "g2", "g2")))
    assert not r.valid and r.rule == "R12" and r.tensor == "b"


def test_a_slower_variant_shows_as_overhead_and_ideal_stays():
    r = run(toy(), variants={"x": "small"})
    assert r.iteration_us == 1502.0 and r.ideal_us == 1002.0 and r.overhead == pytest.approx(500 / 1002)
    assert r.peak_bytes == 2_000_001    # no workspace: a, b and z
    default = run(toy())
    assert default.peak_bytes == 2_004_097


def test_a_variant_whose_workspace_does_not_fit_waits_for_memory():
    profile = toy(({"name": "fast", "time_us": 100, "workspace_bytes": 10_000_000},))
    # with a and b offloaded by the group before x, x's 10 MB workspace fits a 10,000,002-byte
    # budget only once both copies have left (211 us): x starts at 211
    actions = grouped(*SWAPS)
    r = run(profile, *actions, budget=10_000_002, variants={"x": "fast"})
    assert r.ok and r.stall_memory_us == 210.0
    tight = run(profile, budget=10_000_000, variants={"x": "fast"})
    assert tight.valid and not tight.feasible and tight.op == "x"


def test_unknown_variants_are_input_errors():
    profile = toy()
    with pytest.raises(InputError, match="has no variant 'huge'"):
        run(profile, variants={"x": "huge"})
    with pytest.raises(InputError, match="unknown op 'nope'"):
        run(profile, variants={"nope": "small"})


def test_a_recompute_runs_the_chosen_variant():
    # q (100 us, or 300 us as variant "slow") makes r from nothing; r is dropped after q
    # and recomputed before its use by s: both runs of q take the variant's time
    data = profile_dict({"r": (10, "activation"), "o": (1, "activation")},
                        [("q", "forward", 100.0, [], ["r"]), ("m", "forward", 10.0, [], ["o"]),
                         ("s", "backward", 10.0, ["r", "o"], [])], "rec")
    data["ops"][0]["variants"] = [{"name": "slow", "time_us": 300}]
    profile = profile_from_dict(data)
    actions = (drop("r", "q"), recompute("r", "s"))
    fast = run(profile, *actions)
    slow = run(profile, *actions, variants={"q": "slow"})
    assert (fast.iteration_us, slow.iteration_us) == (220.0, 620.0) and slow.recompute_us == 300.0


def test_profile_variants_are_checked():
    data = profile_dict({"a": (8, "activation")}, [("p", "forward", 1.0, [], ["a"])], "v")
    data["ops"][0]["variants"] = [{"name": "default", "time_us": 1}]
    with pytest.raises(InputError, match=r"ops\[0\] \(p\)\.variants\[0\]\.name"):
        profile_from_dict(data)
    data["ops"][0]["variants"] = [{"name": "v", "time_us": -1}]
    with pytest.raises(InputError, match="time_us"):
        profile_from_dict(data)


def test_plan_round_trip(tmp_path):
    profile = toy()
    plan = Plan(profile.name, grouped(*SWAPS), variants={"x": "small"})
    path = tmp_path / "p.json"
    path.write_text(plan_json(plan))
    again = load_plan(path)
    assert again.actions == plan.actions and again.variants == {"x": "small"}


def test_group_option_of_the_planner_core():
    hw = hardware_from_dict(HW)
    actions, groups, members = group_actions(list(SWAPS), hw)
    assert (groups, members) == (2, 4) and [a.group for a in actions] == ["g1", "g1", "g2", "g2"]
    none, groups, _ = group_actions(list(SWAPS), hardware_from_dict({**HW, "pcie": {**HW["pcie"], "latency_us": 0}}))
    assert groups == 0 and all(a.group is None for a in none)
    profile = toy()
    plain = make_plan(profile, hw, 2_100_000, "lms")
    with_groups = make_plan(profile, hw, 2_100_000, "lms", group=True)
    assert with_groups.result.ok and with_groups.result.iteration_us <= plain.result.iteration_us
    assert "group" in with_groups.plan.planner.notes
