"""Placement (R50) and online allocator models (R51), and `swapplan place`'s methods.

The staircase: o1 makes s (512 B); o2 reads s, makes L1 (1024 B); o3 reads L1, makes L2
(1024 B); o4 reads L2. Every op takes 10 us. Lifetimes: s [0, 20), L1 [10, 30), L2
[20, 40) us. The live peak is 2,048 B (L1 and L2 during o3). Placed in allocation order
by first fit, s takes [0, 512), L1 [512, 1536), and L2 finds only the 512-byte hole
below L1: it goes to 1536, an arena of 2,560 B. Largest first, L1 takes [0, 1024), L2
[1024, 2048) and s fits under L2 (they never live together): 2,048 B, the optimum.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.shared.placement import lowest_offset, place, place_blocks
from simulator.api import Simulator
from simulator.plan import Placement, Plan, offload, prefetch
from simulator.profile import profile_sha256
from simulator.run.arena import Ranges
from tests.conftest import make_profile
from tests.engine_helpers import machine


def staircase():
    return make_profile({"s": (512, "activation"), "L1": (1024, "activation"), "L2": (1024, "activation")},
                        [("o1", "forward", 10.0, [], ["s"]), ("o2", "forward", 10.0, ["s"], ["L1"]),
                         ("o3", "forward", 10.0, ["L1"], ["L2"]), ("o4", "forward", 10.0, ["L2"], [])],
                        "staircase")


def placed(profile, offsets, arena, *actions):
    return Plan(profile.name, tuple(actions), profile_sha256=profile_sha256(profile),
                placement=Placement(arena, offsets))


def test_good_placement_runs_as_bytes_do_and_reports_the_arena():
    profile = staircase()
    r = Simulator(profile, machine()).simulate(placed(profile, {"s#1": 1024, "L1#1": 0, "L2#1": 1024}, 2048))
    assert r.ok and r.iteration_us == 40.0 and r.arena_bytes == 2048 and r.peak_bytes == 2048
    plain = Simulator(profile, machine()).simulate(Plan(profile.name))
    assert plain.arena_bytes is None and plain.iteration_us == 40.0


def test_overlapping_placement_is_infeasible_naming_the_holder():
    profile = staircase()
    r = Simulator(profile, machine()).simulate(placed(profile, {"s#1": 0, "L1#1": 0, "L2#1": 1024}, 2048))
    assert r.valid and not r.feasible and r.op == "o2"
    assert r.blocked["allocation"] == "L1#1" and r.blocked["held_by"] == "s"
    assert "'L1#1' at [0, 1024) is held by 's'" in r.reason


@pytest.mark.parametrize("offsets, arena, words", [
    ({"s#1": 0, "L1#1": 1024}, 2048, "no offset for allocation 'L2#1'"),
    ({"s#1": 0, "L1#1": 1024, "L2#1": 1536}, 2048, "passes the arena's 2048 bytes"),
    ({"s#1": 0, "L1#1": 1024, "L2#1": 0, "L2#2": 0}, 2048, "names no GPU allocation"),
])
def test_invalid_placements(offsets, arena, words):
    profile = staircase()
    r = Simulator(profile, machine()).simulate(placed(profile, offsets, arena))
    assert not r.valid and r.rule == "R50" and words in r.reason


def test_arena_larger_than_the_budget_is_infeasible():
    profile = staircase()
    r = Simulator(profile, machine()).simulate(placed(profile, {"s#1": 0, "L1#1": 512, "L2#1": 1536}, 2560), 2048)
    assert r.valid and not r.feasible and r.rule == "R50" and "larger than the budget" in r.reason


def test_prefetch_and_persistent_keys_count_allocations():
    # w is persistent (on the GPU from the start: w#1); a is made by f (a#1), offloaded, and
    # prefetched back before b (a#2), which reads it
    profile = make_profile({"w": (100, "weight"), "a": (200, "activation"), "z": (10, "activation")},
                           [("f", "forward", 10.0, ["w"], ["a"]), ("g", "forward", 500.0, [], ["z"]),
                            ("b", "backward", 10.0, ["a", "w"], [])], "keys")
    hw = machine(h2d=1, d2h=1)
    actions = (offload("a", "f"), prefetch("a", "g", "b"))
    good = placed(profile, {"w#1": 0, "a#1": 100, "a#2": 100, "z#1": 300}, 310, *actions)
    r = Simulator(profile, hw).simulate(good)
    assert r.ok and r.arena_bytes == 310
    missing = placed(profile, {"w#1": 0, "a#1": 100, "z#1": 300}, 310, *actions)
    assert Simulator(profile, hw).simulate(missing).reason.startswith("no offset for allocation 'a#2'")


def test_online_first_fit_fragments_and_waits():
    profile = staircase()
    sim = Simulator(profile, machine())
    stuck = sim.simulate(Plan(profile.name), 2048, allocator="first-fit")
    # L2 needs 1024 contiguous bytes; 1024 are free, as [0, 512) and [1536, 2048)
    assert stuck.valid and not stuck.feasible and stuck.op == "o3"
    assert stuck.blocked["fragmented"] is True and "fragmented" in stuck.reason
    roomy = sim.simulate(Plan(profile.name), 4096, allocator="first-fit")
    assert roomy.ok and roomy.arena_bytes == 2560 and roomy.fragmentation == pytest.approx(2560 / 2048)
    best = sim.simulate(Plan(profile.name), 4096, allocator="best-fit")
    assert best.ok and best.arena_bytes == 2560      # best fit cannot undo L1's place either


def test_allocator_rounds_sizes_to_512():
    profile = make_profile({"a": (1, "activation"), "b": (1, "activation")},
                           [("o1", "forward", 1.0, [], ["a"]), ("o2", "forward", 1.0, ["a"], ["b"])], "tiny")
    r = Simulator(profile, machine()).simulate(Plan(profile.name), allocator="first-fit")
    assert r.ok and r.arena_bytes == 1024 and r.fragmentation == 512.0


def test_methods_on_the_staircase():
    profile = staircase()
    plan = Plan(profile.name, profile_sha256=profile_sha256(profile))
    arenas = {}
    for method in ("smartpool", "greedy-size", "first-fit"):
        out, figures = place(profile, plan, machine(), None, method)
        r = Simulator(profile, machine()).simulate(out)
        assert r.ok and r.arena_bytes == figures["arena_bytes"] and r.iteration_us == 40.0
        arenas[method] = figures["arena_bytes"]
    assert arenas == {"smartpool": 2048, "greedy-size": 2048, "first-fit": 2560}


def test_place_blocks_and_gaps():
    assert lowest_offset(10, [(0, 5), (20, 30)]) == 5
    assert lowest_offset(20, [(0, 5), (20, 30)]) == 30
    # cross-iteration blocks go first with smartpool: p (held to the end) takes offset 0
    offsets, arena = place_blocks([("big", 100, 0, 10, False), ("p", 10, 0, 100, True)], "smartpool")
    assert offsets == {"p": 0, "big": 10} and arena == 110
    ranges = Ranges(100)
    ranges.take("x", 10, 20)
    assert ranges.holder(15, 16) == "x" and ranges.holder(20, 30) is None and ranges.find(15, "first-fit") == 20


def test_place_refuses_a_plan_that_does_not_run():
    profile = staircase()
    with pytest.raises(Exception, match="does not run"):
        place(profile, Plan(profile.name), machine(), 1024, "smartpool")


def test_placement_round_trips_through_json(tmp_path):
    from simulator.plan import load_plan, plan_json
    profile = staircase()
    plan = placed(profile, {"s#1": 1024, "L1#1": 0, "L2#1": 1024}, 2048)
    path = tmp_path / "p.json"
    path.write_text(plan_json(plan))
    again = load_plan(path)
    assert again.placement == plan.placement and replace(again, origin="x").placement.arena_bytes == 2048


def test_persistent_tensors_end_where_they_started():
    from planner.core.api import make_plan
    from simulator.hardware import load_hardware
    from tracer.synthetic import synthesize
    hw = load_hardware("a100-40gb-pcie4")
    profile = synthesize("mlp")
    plan = make_plan(profile, hw, int(profile.peak_bytes * 0.6), "g10").plan
    out, figures = place(profile, plan, hw, None, "smartpool")
    offsets = out.placement.offsets
    fetched = {key.rsplit("#", 1)[0] for key in offsets if key.endswith("#2")}
    persistent = ({t.id for t in profile.tensors if t.persistent} & fetched) - set(plan.initial)
    assert persistent, "the G10 plan brings no weight on the GPU at the start back: the test needs one that does"
    for tid in persistent:   # on the GPU at the start, evicted and fetched again
        numbers = sorted(int(k.rsplit("#", 1)[1]) for k in offsets if k.rsplit("#", 1)[0] == tid)
        assert offsets[f"{tid}#1"] == offsets[f"{tid}#{numbers[-1]}"]   # the next iteration finds it there
    result = Simulator(profile, hw).simulate(out)
    assert result.ok and result.arena_bytes == figures["arena_bytes"]
    # a placement that moves one of them between the start and the end is refused
    tid = sorted(persistent)[0]
    last = max(int(k.rsplit("#", 1)[1]) for k in offsets if k.rsplit("#", 1)[0] == tid)
    moved = dict(offsets)
    moved[f"{tid}#{last}"] = out.placement.arena_bytes
    bad = replace(out, placement=Placement(out.placement.arena_bytes * 2, moved))
    refused = Simulator(profile, hw).simulate(bad)
    assert not refused.valid and "would not find it where it starts" in refused.reason


def test_tied_blocks_share_an_offset_and_the_rest_move_freely():
    # w#1 (start) and w#3 (end) tied; w#2 lives in between, where x holds offset 0
    blocks = [("w#1", 10, 0, 5, False), ("x", 10, 5, 20, False), ("w#2", 10, 10, 15, False),
              ("w#3", 10, 20, 30, True)]
    offsets, arena = place_blocks(blocks, "smartpool", {"w#1": "w", "w#3": "w"})
    assert offsets["w#1"] == offsets["w#3"] == 0 and offsets["x"] == 0 and offsets["w#2"] == 10
    assert arena == 20


def _reference_offsets(blocks, order_key, tied):
    """place_blocks written plainly: each unit at the lowest offset clear of every placed
    block alive with it (a scan of all of them)."""
    units = {}
    for block in blocks:
        units.setdefault(tied.get(block[0], block[0]), []).append(block)
    placed, offsets, arena = [], {}, 0
    for unit in sorted(units.values(), key=order_key):
        size = max(b[1] for b in unit)
        busy = sorted((lo, hi) for s, e, lo, hi in placed for _, _, st, en, _ in unit if s < en and st < e)
        at = 0
        for lo, hi in busy:
            if lo >= at + size:
                break
            at = max(at, hi)
        for key, nbytes, st, en, _ in unit:
            offsets[key] = at
            placed.append((st, en, at, at + nbytes))
            arena = max(arena, at + nbytes)
    return offsets, arena


def test_place_blocks_matches_a_plain_scan_on_random_blocks():
    import random
    rng = random.Random(7)
    for _ in range(200):
        blocks = []
        for i in range(rng.randint(1, 40)):
            start = rng.randint(0, 60)
            blocks.append((f"b{i}#{rng.randint(1, 3)}", rng.choice([1, 3, 8, 64]), start, start + rng.randint(1, 30),
                           rng.random() < 0.15))
        tied = {b[0]: f"t{b[0][1]}" for b in blocks if b[0][1] in "12"}
        expected = _reference_offsets(blocks, lambda u: (min(b[2] for b in u), u[0][0]), tied)
        assert place_blocks(blocks, "first-fit", tied) == expected
        offsets, arena = place_blocks(blocks, "smartpool", tied)
        for a in blocks:       # whatever the order: blocks alive together never share bytes
            for b in blocks:
                if a[0] < b[0] and a[2] < b[3] and b[2] < a[3] and tied.get(a[0], a[0]) != tied.get(b[0], b[0]):
                    assert offsets[a[0]] + a[1] <= offsets[b[0]] or offsets[b[0]] + b[1] <= offsets[a[0]]
        assert arena == max(offsets[b[0]] + b[1] for b in blocks)
